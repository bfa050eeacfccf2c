"""The per-layer K/V rewrite the vLLM plugin runs before vLLM stores K and V: quant.formats.registry'
quantize -> dequantize, the same calls (and so the same bytes and values) as the hf engine's emulated
cache (quant.kv.stream: `quantize_dequantize(fmt, x, scale, x.dtype)`).

vLLM hands an attention layer K [T, H, D] and V [T, H, Dv] (T: the tokens of every sequence in the
step); an MLA layer the latent kv_c [T, Dc] and the rope key k_pe [T, 1, Dr], rewritten as K and V of one
head with one shared decode scale, as the hf engine's MLA cache stores them (quant.kv.layer). Decode
scales: static from the scales the hf engine reads (quant.scales.files.KVScales.load: a `qa calibrate` file
pair, or a model folder read as its writer meant it for the spec's format), `fmt.decode_scale_from_amax(amax)` per layer (and head) exactly as the hf cache
derives them; constant; or none for the self-scaled formats (mxfp4, int8, int4). The plugin moves a
plan's scales to its layer's device once, when it installs the rewrite (`LayerPlan.to`), so a call copies
nothing from the host; a call on another device copies them once and keeps that copy.

The plugin needs only the values, never the packed bytes: where the format has a values-only compiled loop
(`KVFormat.compiled_values`: nvfp4, fp8 with round-to-nearest; CPU tensors, `quant.formats.compiled.enabled`), the
plan prepares it once per stream at install, with the scale checked there, and `rewrite_pair` rewrites K and V
of the same shape in one call on the two stacked. That gives the same values as `quantize_dequantize`
(tests/evals/engines/vllm/kv/test_emulate.py) at about a sixth of the per-call cost of two such calls on a
decode step's [1, 3, 64] K and V. Every other case takes `quantize_dequantize`. Torch only, no vllm.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from quant.errors import QuantError
from quant.formats import compiled
from quant.formats.registry import KVFormat, ValuesFn, get_format, quantize_dequantize
from quant.kv.cache import scale_for, spec_scales
from quant.kv.spec import KVKind, KVQuantSpec
from quant.scales.files import KVScales


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
    # values-only rewrites at the plan's scales, on their device (set by `to`): K, V, and K and V stacked
    _fast: dict[str, ValuesFn] = field(default_factory=dict, repr=False, compare=False)

    @property
    def identity(self) -> bool:
        """Whether the rewrite leaves K and V as they are (format none)."""
        return self.fmt.name == "none"

    def to(self, device: torch.device | str) -> LayerPlan:
        """This plan with its decode scales on `device` (the layer's, at install: no copy per call)."""
        k, v = (None if t is None else t.to(device) for t in (self.k_scale, self.v_scale))
        return replace(self, k_scale=k, v_scale=v, _moved={}, _fast=_fast_rewrites(self.fmt, k, v))

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


def _fast_rewrites(fmt: KVFormat, k: torch.Tensor | None, v: torch.Tensor | None) -> dict[str, ValuesFn]:
    """The format's values-only rewrites at scales k and v (() or [H, 1]): "k", "v" for one stream [T, H, D],
    "pair" for K and V stacked [2, T, H, D] (scales stacked to [2, 1, H or 1, 1]); empty when the format has
    none or the scales are not on the CPU."""
    prepare = getattr(fmt, "compiled_values", None)
    if prepare is None or k is None or v is None or k.device.type != "cpu":  # the compiled loops run on CPU
        return {}
    fast = {"k": prepare(k), "v": prepare(v), "pair": prepare(torch.stack(torch.broadcast_tensors(k, v)).reshape(2, 1, -1, 1))}
    return {name: fn for name, fn in fast.items() if fn is not None}


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
    k, v = (_per_head(scale_for(spec, scales, fmt, layer, kind, mla)) for kind in ("k", "v"))
    return LayerPlan(layer, fmt, k, v, _fast=_fast_rewrites(fmt, k, v))


def _per_head(d: torch.Tensor | None) -> torch.Tensor | None:
    """A decode scale as vLLM's [T, H, D] broadcasts it: () stays, [1, H, 1, 1] becomes [H, 1]."""
    return d.reshape(-1, 1) if d is not None and d.dim() else d


def rewrite(plan: LayerPlan, x: torch.Tensor, kind: KVKind) -> torch.Tensor:
    """x [T, H, D] (or [T, D]) as the cache would hold it: quantized and read back in x's dtype."""
    if plan.identity or x.numel() == 0:
        return x
    scale = plan.scale(kind, x.device)
    fast = plan._fast.get(kind)
    if fast is not None and scale is (plan.k_scale if kind == "k" else plan.v_scale) and compiled.enabled(x):
        values = fast(x, x.dtype, 0)
        if values is not None:
            return values
    return quantize_dequantize(plan.fmt, x.contiguous(), scale, x.dtype)[1]


def rewrite_pair(plan: LayerPlan, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewrite(plan, key, "k"), rewrite(plan, value, "v")), in one compiled call on the two stacked when
    they have the same shape [T, H, D] and dtype on the plan's device and the format has a values-only loop."""
    fast = plan._fast.get("pair")
    if (fast is not None and not plan.identity and key.dim() == 3 and key.shape == value.shape
            and key.dtype == value.dtype and plan.k_scale is not None and key.device == plan.k_scale.device):
        both = torch.stack((key, value))  # [2, T, H, D]
        if both.numel() and compiled.enabled(both):
            values = fast(both, key.dtype, 1)
            if values is not None:
                return values[0], values[1]
    return rewrite(plan, key, "k"), rewrite(plan, value, "v")
