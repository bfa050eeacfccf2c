"""Continuous batching (rows refilled as sequences finish) and speculative greedy decoding with
prompt-lookup drafts: both give exactly the one-request-at-a-time, one-token-per-step results."""

from __future__ import annotations

import pytest

from evals.engines.base import GenerateRequest
from evals.engines.hf.decode import ContinuousBatch, generate_stream
from tests.evals.hf_fixtures import PROMPTS, reference_greedy, tiny_engine


def _varied_requests() -> list[GenerateRequest]:
    """Prompts of different lengths and budgets: rows finish at different steps and get refilled."""
    texts = [" ".join([PROMPTS[i % 3]] * (1 + i % 4)) for i in range(7)]
    return [GenerateRequest(prompt=t, max_tokens=3 + 5 * (i % 3)) for i, t in enumerate(texts)]


@pytest.mark.parametrize("kv", [None, {"format": "nvfp4"}, {"format": "nvfp4", "recent_window": 4}])
def test_continuous_batching_refills_rows_and_equals_one_request_at_a_time(kv) -> None:
    args = {} if kv is None else {"kv": kv}
    narrow = tiny_engine({"batch_size": 2, **args})  # 7 requests through 2 rows: 5 refills
    single = tiny_engine({"batch_size": 1, **args})
    assert narrow.hf.rows_ok
    assert type(narrow.hf.new_cache()).__name__ == ("PlainKVCache" if kv is None else "QuantizedKVCache")
    reqs = _varied_requests()
    batched = narrow.generate(reqs)
    for req, res in zip(reqs, batched, strict=True):
        assert res == single.generate([req])[0]
    if kv is None:
        for req, res in zip(reqs, batched, strict=True):
            assert res.text == reference_greedy(narrow, req.prompt, req.max_tokens)[1]


def test_sampled_draws_survive_refills_and_other_batch_mates() -> None:
    reqs = [GenerateRequest(prompt=r.prompt, max_tokens=r.max_tokens, temperature=1.0, seed=10 + i)
            for i, r in enumerate(_varied_requests())]
    narrow, single = tiny_engine({"batch_size": 2}), tiny_engine({"batch_size": 1})
    assert narrow.generate(reqs) == [single.generate([r])[0] for r in reqs]


def test_rows_longer_than_the_batch_pad_it_and_errors_fall_back_to_one_by_one(monkeypatch) -> None:
    engine = tiny_engine({"batch_size": 2})
    reqs = _varied_requests()
    want = [engine.generate([r])[0] for r in reqs]
    members = sorted(((i, engine.hf.tokens.encode(r.prompt)) for i, r in enumerate(reqs)), key=lambda m: len(m[1]))
    out = generate_stream(engine.hf, reqs, members, None)  # shortest first: every refill is longer than the batch
    assert [out[i] for i in range(len(reqs))] == want
    from quant.kv.plain import PlainKVCache

    def broken(*_args, **_kwargs):
        raise RuntimeError("simulated failure while joining rows")

    monkeypatch.setattr(PlainKVCache, "stack", broken)
    assert engine.generate(reqs) == want  # the fixed-batch path, one request at a time


def _repetitive_requests() -> list[GenerateRequest]:
    """Prompts that repeat themselves (drafts are found), greedy and sampled, with stop strings and
    budgets that end sequences in the middle of a step's accepted drafts."""
    texts = [" ".join([PROMPTS[i % 3]] * (2 + i % 3)) for i in range(8)]
    return [GenerateRequest(prompt=t, max_tokens=6 + 7 * (i % 3), until=("dog",) if i % 4 == 1 else (),
                            temperature=1.0 if i % 4 == 3 else 0.0, seed=i) for i, t in enumerate(texts)]


def test_draft_tokens_give_exactly_the_one_token_per_step_results(monkeypatch) -> None:
    reqs = _repetitive_requests()
    plain = tiny_engine({"batch_size": 3, "draft_tokens": 0})
    spec = tiny_engine({"batch_size": 3})  # draft_tokens defaults to 4
    assert spec.hf.drafts_ok and not plain.hf.drafts_ok
    emitted: list[int] = []
    real = ContinuousBatch.speculative_step

    def counting(self, live, drafts, cache, mask):
        before = [len(row.tokens) for _, row in live]
        result = real(self, live, drafts, cache, mask)
        emitted.extend(len(row.tokens) - b for (_, row), b in zip(live, before, strict=True))
        return result

    monkeypatch.setattr(ContinuousBatch, "speculative_step", counting)
    got = spec.generate(reqs)
    assert emitted and max(emitted) > 1  # steps that kept confirmed drafts happened
    assert got == plain.generate(reqs)
    assert got == [tiny_engine({"batch_size": 1, "draft_tokens": 0}).generate([r])[0] for r in reqs]
    for req, res in zip(reqs, got, strict=True):
        if req.temperature == 0 and not req.until:
            assert res.text == reference_greedy(spec, req.prompt, req.max_tokens)[1]


@pytest.mark.parametrize(("kv", "drafts"), [({"format": "nvfp4"}, True),
                                            ({"format": "nvfp4", "recent_window": 4}, False)])
def test_draft_tokens_with_the_quantized_cache(kv, drafts) -> None:
    reqs = [r for r in _repetitive_requests() if r.temperature == 0]
    spec = tiny_engine({"batch_size": 3, "kv": kv})
    assert spec.hf.drafts_ok is drafts  # a recent window would hold the masked-out positions too
    assert spec.generate(reqs) == tiny_engine({"batch_size": 3, "kv": kv, "draft_tokens": 0}).generate(reqs)
