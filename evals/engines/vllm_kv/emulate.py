"""The per-layer K/V rewrite the vLLM plugin runs before vLLM stores K and V: quant.formats'
quantize -> dequantize, the same calls (and so the same bytes and values) as the hf engine's emulated
cache (quant.kv.stream: `quantize_dequantize(fmt, x, scale, x.dtype)`).

vLLM hands an attention layer K [T, H, D] and V [T, H, Dv] (T: the tokens of every sequence in the
step); an MLA layer the latent kv_c [T, Dc] and the rope key k_pe [T, 1, Dr], rewritten as K and V of one
head with one shared decode scale, as the hf engine's MLA cache stores them (quant.kv.layer). Decode
scales: static from the scales the hf engine reads (quant.scales.KVScales.load: a `qa calibrate` file
pair, or a model folder read as its writer meant it for the spec's format), `fmt.decode_scale_from_amax(amax)` per layer (and head) exactly as the hf cache
derives them; constant; or none for the self-scaled formats (mxfp4, int8, int4). The plugin moves a
plan's scales to its layer's device once, when it installs the rewrite (`LayerPlan.to`), so a call copies
nothing from the host; a call on another device copies them once and keeps that copy. Torch only, no vllm.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from quant.errors import QuantError
from quant.formats import KVFormat, get_format, quantize_dequantize
from quant.kv.cache import scale_for, spec_scales
from quant.kv_spec import KVKind, KVQuantSpec
from quant.scales import KVScales


@dataclass(frozen=True)
class LayerPlan:
    """How one attention layer's K and V are rewritten: format and decode scales (None: self-scaled or
    unquantized); scales have shape () or [H, 1] (one per KV head, broadcast over [T, H, D])."""

    layer: int
    fmt: KVFormat
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    # (kind, device) -> that stream's scale on that device: filled at most once per device, never per call
    _moved: dict[tuple[KVKind, torch.device], torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    @property
    def identity(self) -> bool:
        """Whether the rewrite leaves K and V as they are (format none)."""
        return self.fmt.name == "none"

    def to(self, device: torch.device | str) -> LayerPlan:
        """This plan with its decode scales on `device` (the layer's, at install: no copy per call)."""
        k, v = (None if t is None else t.to(device) for t in (self.k_scale, self.v_scale))
        return replace(self, k_scale=k, v_scale=v, _moved={})

    def scale(self, kind: KVKind, device: torch.device) -> torch.Tensor | None:
        """The decode scale of stream `kind` on `device`: the plan's own tensor when it is there, else a copy
        made on the first call for that device and reused after."""
        own = self.k_scale if kind == "k" else self.v_scale
        if own is None or own.device == device:
            return own
        moved = self._moved.get((kind, device))
        if moved is None:
            moved = self._moved[(kind, device)] = own.to(device)
        return moved


def load_scales(spec: KVQuantSpec) -> KVScales | None:
    """The static scales the spec names (None unless scales = 'static'); QuantError when unreadable."""
    return spec_scales(spec)


def layer_plan(spec: KVQuantSpec, scales: KVScales | None, layer: int, *, mla: bool = False) -> LayerPlan:
    """The rewrite of attention layer `layer`: its decode scales as the hf cache takes them (quant.kv.cache.
    scale_for; an MLA layer's K and V share one static scale), shaped [H, 1] for vLLM's [T, H, D] when per head."""
    fmt = get_format(spec.layer_format(layer))
    if not fmt.needs_tensor_scale:
        return LayerPlan(layer, fmt, None, None)
    if spec.scales == "static" and scales is None or spec.scales == "dynamic":
        # spec.refusal keeps per-sequence dynamic scales of these formats out
        raise QuantError(f"layer {layer}: {fmt.name} needs static or constant decode scales in vLLM")
    k, v = (scale_for(spec, scales, fmt, layer, kind, mla) for kind in ("k", "v"))
    return LayerPlan(layer, fmt, _per_head(k), _per_head(v))


def _per_head(d: torch.Tensor | None) -> torch.Tensor | None:
    """A decode scale as vLLM's [T, H, D] broadcasts it: () stays, [1, H, 1, 1] becomes [H, 1]."""
    return d.reshape(-1, 1) if d is not None and d.dim() else d


def rewrite(plan: LayerPlan, x: torch.Tensor, kind: KVKind) -> torch.Tensor:
    """x [T, H, D] (or [T, D]) as the cache would hold it: quantized and read back in x's dtype."""
    if plan.identity or x.numel() == 0:
        return x
    _, values = quantize_dequantize(plan.fmt, x.contiguous(), plan.scale(kind, x.device), x.dtype)
    return values
