"""Bytes per token per layer of every KV format (quant.formats.catalog.kv_bytes_per_token) against the
page size vLLM 0.32 allocates for it: each backend's own customize_spec on vLLM's AttentionSpec (NVFP4's
backend, FlashInfer, and UltraQuant's, whose decode module needs a real triton, do not import on a CPU:
their customize_spec's lines are spelled out here with vLLM's own nvfp4_kv_cache_full_dim and UltraQuant's
format.slot_size)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from quant.formats.catalog import FORMAT_NAMES, TOOLKIT_ONLY_FORMATS, kv_bytes_per_token

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

pytestmark = pytest.mark.vllm

BLOCK = 16
# format -> the kv_cache_dtype vLLM is started with (none: the model's bf16 cache)
VLLM_DTYPE = {"none": "auto", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def _vllm_bytes_per_token(cache_dtype: str, head_dim: int, heads: int) -> int:
    import torch  # torch: vLLM's spec carries a torch dtype
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE, nvfp4_kv_cache_full_dim  # vllm: cache dtype
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
    from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionBackend
    from vllm.v1.attention.ops.ultraquant.format import slot_size  # UltraQuant's packed K|V slot
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    dtype = torch.bfloat16 if cache_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[cache_dtype]
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=heads, head_size=head_dim, dtype=dtype,
                             kv_quant_mode=get_kv_quant_mode(cache_dtype))
    for backend in (TritonAttentionBackend, TurboQuantAttentionBackend):
        spec = backend.customize_spec(spec)  # each changes only the modes it runs
    if spec.kv_quant_mode.is_nvfp4:  # FlashInferBackend.customize_spec
        spec = replace(spec, num_head_slots=2 * heads, state_content_bytes=nvfp4_kv_cache_full_dim(head_dim))
    if spec.kv_quant_mode.is_ultraquant:  # UltraQuantAttentionBackend.customize_spec
        spec = replace(spec, state_content_bytes=slot_size(head_dim))
    page = spec.page_size_bytes  # K and V of one block of one layer
    assert page % BLOCK == 0
    return page // BLOCK


@pytest.mark.parametrize("name", [n for n in FORMAT_NAMES if n not in TOOLKIT_ONLY_FORMATS])
@pytest.mark.parametrize(("head_dim", "heads"), [(64, 3), (128, 8)])
def test_bytes_per_token_match_vllms_page(name: str, head_dim: int, heads: int) -> None:
    expected = _vllm_bytes_per_token(VLLM_DTYPE.get(name, name), head_dim, heads)
    assert kv_bytes_per_token(name, head_dim, heads) == expected


def test_smollm2_sizes() -> None:
    # SmolLM2-135M: 3 KV heads of 64 per layer; bf16 = 768 bytes per token per layer
    sizes = {n: kv_bytes_per_token(n, 64, 3) for n in ("none", "fp8_e4m3", "nvfp4", "int4_per_token_head",
                                                       "turboquant_4bit_nc", "turboquant_3bit_nc",
                                                       "ultraquant_4bit")}
    assert sizes == {"none": 768, "fp8_e4m3": 384, "nvfp4": 216, "int4_per_token_head": 216,
                     "turboquant_4bit_nc": 210, "turboquant_3bit_nc": 162, "ultraquant_4bit": 204}
