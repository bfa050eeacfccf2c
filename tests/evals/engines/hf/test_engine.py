"""HFEngine through the Engine protocol: generation against `model.generate`, stop strings, EOS,
seeded sampling, failures in their own slot, chunked prefill, engine info; a few real items on
SmolLM2-135M (slow)."""

from __future__ import annotations

import pytest
import torch

from evals.engines import base as engine_base
from evals.engines.base import Engine
from evals.engines.hf.engine import HFEngine
from evals.engines.lmeval_tokens import encode_pair
from tests.evals.hf_fixtures import (
    PROMPTS,
    direct_loglikelihood,
    reference_greedy,
    smollm2_or_skip,
    tiny_engine,
)

torch.set_num_threads(1)


def test_engine_protocol_and_info(engine: HFEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.info.name == "hf" and engine.info.deterministic
    assert engine.info.details["kv"] == "none" and engine.info.details["max_length"] == "256"
    q = tiny_engine({"kv": {"format": "nvfp4"}})
    assert q.info.details["kv"].startswith("KVQuantSpec(")


def test_args_swapped_between_calls_are_read_by_the_next_request(engine: HFEngine) -> None:
    saved = engine.args
    engine.args = saved.model_copy(update={"batch_size": 1})
    try:
        assert engine.hf.args.batch_size == 1
    finally:
        engine.args = saved


def test_batched_greedy_equals_model_generate_per_prompt(engine: HFEngine) -> None:
    results = engine.generate([engine_base.GenerateRequest(prompt=p, max_tokens=8) for p in PROMPTS])
    for prompt, res in zip(PROMPTS, results, strict=True):
        ids, text = reference_greedy(engine, prompt, 8)
        assert isinstance(res, engine_base.GenerateResult)
        assert res.text == text
        assert res.output_tokens == len(ids) == 8
        assert res.finish_reason == "length"


def test_result_does_not_depend_on_batch_composition(engine: HFEngine) -> None:
    alone = engine.generate([engine_base.GenerateRequest(prompt=PROMPTS[1], max_tokens=6)])[0]
    batched = engine.generate([engine_base.GenerateRequest(prompt=p, max_tokens=6) for p in PROMPTS])[1]
    assert alone == batched


def test_stop_string_cuts_at_first_occurrence_like_lm_eval(engine: HFEngine) -> None:
    full = engine.generate([engine_base.GenerateRequest(prompt=PROMPTS[0], max_tokens=10)])[0]
    assert isinstance(full, engine_base.GenerateResult) and len(full.text) >= 4
    # a 2-character piece of the greedy text (not a partial-byte replacement char): generation stops there
    at = next(i for i in range(1, len(full.text) - 1) if "\ufffd" not in full.text[i : i + 2])
    stop = full.text[at : at + 2]
    res = engine.generate([engine_base.GenerateRequest(prompt=PROMPTS[0], max_tokens=10, until=(stop, "never-seen"))])[0]
    assert isinstance(res, engine_base.GenerateResult)
    assert res.text == full.text.split(stop)[0]
    assert res.finish_reason == "stop"


def test_eos_stops_generation_and_is_not_in_the_text() -> None:
    eos_engine = tiny_engine({"batch_size": 2})
    ids, _ = reference_greedy(eos_engine, PROMPTS[0], 4)
    eos_engine.hf.tokens.eos_ids = frozenset({ids[1]})  # the second greedy token is now an end-of-sequence token
    res = eos_engine.generate([engine_base.GenerateRequest(prompt=PROMPTS[0], max_tokens=5)])[0]
    assert isinstance(res, engine_base.GenerateResult)
    assert (res.finish_reason, res.output_tokens) == ("stop", 2)
    assert res.text == eos_engine.tokenizer.decode(ids[:1], skip_special_tokens=True)


def test_sampling_is_seeded_per_request_and_independent_of_batch(engine: HFEngine) -> None:
    def req(seed: int, prompt: str = PROMPTS[2]) -> engine_base.GenerateRequest:
        return engine_base.GenerateRequest(prompt=prompt, max_tokens=8, temperature=1.0, seed=seed)

    a = engine.generate([req(1)])[0]
    b = engine.generate([req(2), req(1, PROMPTS[0]), req(1)])
    assert b[2] == a  # same seed, other batch mates: same draw
    assert b[0] != a  # another seed draws differently (8 tokens from a flat-ish distribution)
    greedy = engine.generate([engine_base.GenerateRequest(prompt=PROMPTS[2], max_tokens=8)])[0]
    assert a != greedy


def test_top_p_small_keeps_only_the_argmax(engine: HFEngine) -> None:
    greedy = engine.generate([engine_base.GenerateRequest(prompt=PROMPTS[0], max_tokens=6)])[0]
    nucleus = engine.generate([engine_base.GenerateRequest(prompt=PROMPTS[0], max_tokens=6, temperature=1.0, top_p=1e-6, seed=3)])[0]
    assert nucleus == greedy


def test_top_k_one_and_min_p_one_keep_only_the_argmax_and_top_k_narrows_the_draw(engine: HFEngine) -> None:
    greedy = engine.generate([engine_base.GenerateRequest(prompt=PROMPTS[0], max_tokens=6)])[0]
    hot = [engine_base.GenerateRequest(prompt=PROMPTS[0], max_tokens=6, temperature=3.0, seed=s, **kw)
           for s in (1, 2) for kw in ({"top_k": 1}, {"min_p": 1.0})]
    assert engine.generate(hot) == [greedy] * 4  # type: ignore[arg-type]
    free = engine.generate([engine_base.GenerateRequest(prompt=PROMPTS[0], max_tokens=6, temperature=3.0, seed=1)])
    top5 = engine.generate([engine_base.GenerateRequest(prompt=PROMPTS[0], max_tokens=6, temperature=3.0, seed=1,
                                                        top_k=5)])
    assert free[0] != greedy and top5[0] != free[0]  # the same seed draws from another distribution


def test_bad_request_fails_in_its_slot_only(engine: HFEngine) -> None:
    results = engine.generate([engine_base.GenerateRequest(prompt=PROMPTS[0], max_tokens=4),
                               engine_base.GenerateRequest(prompt=PROMPTS[1], max_tokens=10_000),
                               engine_base.GenerateRequest(prompt=PROMPTS[2], max_tokens=4)])
    assert isinstance(results[0], engine_base.GenerateResult) and isinstance(results[2], engine_base.GenerateResult)
    assert isinstance(results[1], engine_base.Failure) and "max_tokens" in results[1].error


def test_long_prompt_prefilled_in_chunks_equals_one_pass() -> None:
    one = tiny_engine({"prefill_chunk": 2048})
    chunked = tiny_engine({"prefill_chunk": 16})
    prompt = " ".join([PROMPTS[1]] * 6)  # ~60 tokens: 4 chunks of 16
    a = one.generate([engine_base.GenerateRequest(prompt=prompt, max_tokens=6)])[0]
    b = chunked.generate([engine_base.GenerateRequest(prompt=prompt, max_tokens=6)])[0]
    assert a == b


def test_close_drops_the_model_and_the_prefixes() -> None:
    eng = tiny_engine()
    eng.prefixes.get("Question: what is 2 + 3? Answer: 5.\n\n")
    eng.close()
    assert eng.model is None and len(eng.prefixes) == 0


@pytest.mark.slow
def test_smollm2_greedy_and_loglikelihood_match_references() -> None:
    from evals.engines import build_engine, parse_engine_args

    eng = build_engine("hf", smollm2_or_skip(), parse_engine_args("hf", {"batch_size": 4}))
    assert isinstance(eng, HFEngine)
    prompts = ["Question: What is 2+3?\nAnswer:", "The capital of France is", "List three colors:"]
    results = eng.generate([engine_base.GenerateRequest(prompt=p, max_tokens=12, until=("\n\n",)) for p in prompts])
    for p, res in zip(prompts, results, strict=True):
        _, text = reference_greedy(eng, p, 12)
        assert isinstance(res, engine_base.GenerateResult)
        assert res.text == text.split("\n\n")[0]
    req = engine_base.LoglikelihoodRequest(context="The capital of France is", continuations=(" Paris", " London"))
    res = eng.loglikelihood([req])[0]
    assert isinstance(res, engine_base.LoglikelihoodResult)
    for cont, ll in zip(req.continuations, res.loglikelihoods, strict=True):
        ctx_ids, cont_ids = encode_pair(eng.hf.tokens, req.context, cont)
        assert ll == pytest.approx(direct_loglikelihood(eng, ctx_ids, cont_ids), abs=1e-4)
    assert res.loglikelihoods[0] > res.loglikelihoods[1]
    assert res.is_greedy == (True, False)
    eng.close()
