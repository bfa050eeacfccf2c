"""Prompt-lookup drafts for speculative greedy decoding: guess the next tokens by finding the latest
earlier occurrence of the sequence's last n tokens (n = 3, 2, 1) and copying what followed it.

Few-shot prompts repeat their own format, answers quote their question, and small models that run
away repeat themselves, so the guesses are often right. The engine feeds the guesses with the
pending token in one forward pass and keeps the longest prefix that greedy decoding confirms: the
output is the greedy output, in fewer passes. The index is updated per appended token in O(n), so
a lookup costs a few dictionary probes however long the sequence is.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_NGRAM = 3  # longest suffix looked up first; a longer match predicts better


class PromptLookup:
    """The token history of one sequence and, for every n-gram (n <= MAX_NGRAM) that is followed by
    at least one token, where its latest occurrence ends."""

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after its latest occurrence
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens; each one completes the n-grams that end just before it."""
        for tok in tokens:
            end = len(self.tokens)  # the new token's index: it follows the n-grams ending at end - 1
            for n in range(1, min(MAX_NGRAM, end) + 1):
                self._next[tuple(self.tokens[end - n : end])] = end
            self.tokens.append(tok)

    def draft(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix
        (3, then 2, then 1 tokens); [] when none of them occurred before or k < 1."""
        if k < 1:
            return []
        end = len(self.tokens)
        for n in range(min(MAX_NGRAM, end), 0, -1):
            start = self._next.get(tuple(self.tokens[end - n :]))
            if start is not None:
                return self.tokens[start : start + k]
        return []
