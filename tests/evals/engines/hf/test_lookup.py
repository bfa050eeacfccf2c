"""Prompt-lookup drafts: the latest earlier occurrence of the longest matching suffix, kept by an
index that gives the same answers as searching the whole history."""

from __future__ import annotations

import random

from evals.engines.hf.lookup import MAX_NGRAM, PromptLookup


def _naive_draft(tokens: list[int], k: int) -> list[int]:
    """Search the history backwards for the suffix of length 3, then 2, then 1."""
    for n in range(min(MAX_NGRAM, len(tokens)), 0, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def test_latest_occurrence_of_the_longest_suffix_wins() -> None:
    lookup = PromptLookup([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3])
    assert lookup.draft(2) == [7, 5]  # (1, 2, 3) last seen before the end at index 4
    assert lookup.draft(10) == [7, 5, 1, 2, 3]  # runs up to the end of the history
    assert PromptLookup([5, 6, 7, 8, 6]).draft(2) == [7, 8]  # (8, 6) unseen: falls back to (6,)
    assert PromptLookup([4, 4]).draft(3) == [4]
    assert PromptLookup([1, 2, 3]).draft(4) == []  # nothing repeats
    assert PromptLookup([1, 2, 1]).draft(0) == []
    assert PromptLookup().draft(3) == []


def test_incremental_index_equals_a_full_search() -> None:
    rng = random.Random(0)
    for trial in range(200):
        tokens = [rng.randrange(4 if trial % 2 else 12) for _ in range(rng.randrange(1, 60))]
        cut = rng.randrange(len(tokens) + 1)
        lookup = PromptLookup(tokens[:cut])
        lookup.extend(tokens[cut:])
        assert lookup.tokens == tokens and len(lookup) == len(tokens)
        for k in (1, 3, 8):
            assert lookup.draft(k) == _naive_draft(tokens, k), (tokens, k)
