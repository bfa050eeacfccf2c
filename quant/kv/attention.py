"""The attention side of an engine profile: a transformers attention function that does what the engine's
attention kernel does beyond reading the cache.

The emulated cache only sees K and V. Engines that also round the query (llama.cpp: Q to q8_0 in the
Hadamard basis for a quantized K; FlashInfer's NVFP4 path: Q in FP8 E4M3), or whose kernel flushes
small partial sums (vLLM-CPU's AMX-BF16 FP8 path: partial sums of Q.K and unnormalized P.V below the flush
bound become 0, quant.kv_profiles.amx_fp8_attention), need the attention call itself:
`profile_attention(spec)` registers, once per setting, an attention implementation that does so; set it
with `model.set_attn_implementation(name)`. None when the spec's profile needs nothing beyond the cache.
"""

from __future__ import annotations

from typing import Any

import torch

from quant.formats import FP8Format, get_format
from quant.kv_profiles import AMX_FLUSH_BELOW, amx_fp8_attention, get_profile, round_query
from quant.kv_spec import KVQuantSpec

ATTENTION_PREFIX = "qa_kv_profile_"  # registered name: prefix + profile name (dashes as underscores)
_REGISTERED: set[str] = set()


def profile_attention(spec: KVQuantSpec) -> str | None:
    """Name of the registered attention implementation that rounds Q for `spec`'s profile; None if none is needed."""
    if spec.profile is None or spec.format == "none":
        return None
    p = get_profile(spec.profile)
    from transformers import AttentionInterface  # transformers: only when a profile rounds Q

    if p.amx_flush:
        fmt = get_format(spec.format)
        assert isinstance(fmt, FP8Format) and spec.constant_scale is not None  # checked by KVQuantSpec
        bound = AMX_FLUSH_BELOW[fmt.kind] * float(spec.constant_scale)
        name = f"{ATTENTION_PREFIX}{p.name.replace('-', '_')}_{fmt.kind}_{bound!r}".replace(".", "p")
        if name not in _REGISTERED:
            AttentionInterface.register(name, _flushing_attention(bound))
            _REGISTERED.add(name)
        return name
    if p.query == "none":
        return None
    name = ATTENTION_PREFIX + p.name.replace("-", "_")
    if name in _REGISTERED:
        return name
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # transformers: as above

    how, rotated = p.query, p.rotate

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        """SDPA over Q [B, H, n, D] rounded as the engine rounds it."""
        return sdpa_attention_forward(module, round_query(query, how, rotated), key, value, attention_mask,
                                      **kwargs)

    AttentionInterface.register(name, attention)
    _REGISTERED.add(name)
    return name


def _flushing_attention(bound: float) -> Any:
    """Attention as vLLM-CPU's AMX-BF16 FP8 kernel computes it (quant.kv_profiles.amx_fp8_attention), with
    `bound` the flush bound times the k/v scale, in model units."""

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                  **kwargs: Any) -> tuple[torch.Tensor, None]:
        """Q [B, H, n, D], K/V [B, Hkv, S, D] -> output [B, n, H, D]."""
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return amx_fp8_attention(query, key, value, attention_mask, scale, bound), None

    return attention
