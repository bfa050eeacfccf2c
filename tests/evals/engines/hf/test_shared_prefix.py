"""The shared few-shot prefix: computed once, kept for the most recent MAX_PREFIXES, read from the
cache by the suffixes, and giving the same results as recomputing it per request."""

from __future__ import annotations

import pytest

from evals.engines.base import GenerateRequest, LoglikelihoodRequest, LoglikelihoodResult
from evals.engines.hf.engine import HFEngine
from evals.engines.hf.shared_prefix import MAX_PREFIXES
from tests.evals.hf_fixtures import tiny_engine

PREFIX = "Question: what is 2 + 3? Answer: 5.\n\nQuestion: what is 1 + 1? Answer: 2.\n\n"


def test_prefix_ids_leave_out_the_last_token_and_short_or_disabled_prefixes_are_not_cached(engine: HFEngine) -> None:
    engine.prefixes.clear()
    entry = engine.prefixes.get(PREFIX)
    assert entry is not None and list(entry.ids) == engine.hf.tokens.encode(PREFIX)[:-1]
    assert engine.prefixes.get(PREFIX) is entry and len(engine.prefixes) == 1
    assert engine.prefixes.get("Q") is None and engine.prefixes.get(None) is None
    assert tiny_engine({"prefix_reuse": False}).prefixes.get(PREFIX) is None


def test_only_the_most_recent_prefixes_are_kept(engine: HFEngine) -> None:
    engine.prefixes.clear()
    texts = [f"Question {i}: what is {i} + {i}? Answer: {2 * i}.\n\n" for i in range(MAX_PREFIXES + 2)]
    entries = [engine.prefixes.get(t) for t in texts]
    assert len(engine.prefixes) == MAX_PREFIXES
    assert engine.prefixes.get(texts[-1]) is entries[-1]  # still cached
    assert engine.prefixes.get(texts[0]) is not entries[0]  # evicted, recomputed


def test_generation_prefix_reuse_gives_the_same_text(engine: HFEngine) -> None:
    reqs = [GenerateRequest(prompt=PREFIX + q, max_tokens=6, prefix=PREFIX) for q in ("Question: the fox?", "The town")]
    engine.prefixes.clear()
    with_prefix = engine.generate(reqs)
    assert len(engine.prefixes) == 1  # computed once, reused by both requests
    without = engine.generate([GenerateRequest(prompt=r.prompt, max_tokens=6) for r in reqs])
    assert with_prefix == without


def test_loglikelihood_prefix_reuse_matches_full_forward(engine: HFEngine) -> None:
    prefix = "Question: what is 2 + 3? Answer: 5.\n\n"
    reqs = [LoglikelihoodRequest(context=prefix + "Question: a fox? Answer:", continuations=(" yes", " no"),
                                 prefix=prefix),
            LoglikelihoodRequest(context=prefix + "The town", continuations=(" by the river",), prefix=prefix)]
    engine.prefixes.clear()
    reused = engine.loglikelihood(reqs)
    assert len(engine.prefixes) == 1
    plain = tiny_engine({"prefix_reuse": False}).loglikelihood(reqs)  # one full row per pair
    for a, b in zip(reused, plain, strict=True):
        assert isinstance(a, LoglikelihoodResult) and isinstance(b, LoglikelihoodResult)
        assert a.loglikelihoods == pytest.approx(b.loglikelihoods, abs=1e-4)
        assert a.is_greedy == b.is_greedy
