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
from quant.kv_spec import KVKind, KVQuantSpec
from quant.scales import KVScales, load_spec_scales


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
    if spec.scales != "static":
        return None
    if spec.scales_file is None:
        raise QuantError("scales = 'static' needs calibrated scales: set scales_file (made by `qa calibrate`)")
    return load_spec_scales(spec)  # the hf cache's reading: a file pair, or a folder read for the spec's format


def _static(scales: KVScales, fmt: KVFormat, layer: int, kind: KVKind, shared: bool) -> torch.Tensor:
    """Decode scale of one stream from calibrated amax (`shared`: the larger of K's and V's), () or [H, 1]."""
    amax = scales.amax(layer, kind)
    if shared:
        amax = torch.maximum(scales.amax(layer, "k"), scales.amax(layer, "v"))
    d = fmt.decode_scale_from_amax(amax)
    return d.reshape(-1, 1) if d.dim() else d  # [1, H, 1, 1] -> [H, 1] for vLLM's [T, H, D]


def layer_plan(spec: KVQuantSpec, scales: KVScales | None, layer: int, *, mla: bool = False) -> LayerPlan:
    """The rewrite of attention layer `layer` (an MLA layer's K and V share one static scale)."""
    fmt = get_format(spec.layer_format(layer))
    if not fmt.needs_tensor_scale:
        return LayerPlan(layer, fmt, None, None)
    if spec.scales == "constant":
        d = torch.tensor(float(spec.constant_scale), dtype=torch.float32)  # type: ignore[arg-type]
        return LayerPlan(layer, fmt, d, d)
    if scales is None:  # spec.refusal keeps per-sequence dynamic scales of these formats out
        raise QuantError(f"layer {layer}: {fmt.name} needs static or constant decode scales in vLLM")
    return LayerPlan(layer, fmt, _static(scales, fmt, layer, "k", mla), _static(scales, fmt, layer, "v", mla))


def check_scales_fit(scales: KVScales | None, num_layers: int, num_kv_heads: int) -> None:
    """QuantError when static scales do not cover the model's layers (or its KV heads, per-head scales)."""
    if scales is None:
        return
    if scales.num_layers != num_layers:
        raise QuantError(f"the scales file covers {scales.num_layers} layers, the model has {num_layers}; "
                         "calibrate scales for this model")
    if scales.meta.granularity == "head" and scales.meta.num_kv_heads != num_kv_heads:
        raise QuantError(f"the scales file has {scales.meta.num_kv_heads} KV heads per layer, the model has "
                         f"{num_kv_heads} (per rank under tensor parallelism: use per-tensor scales)")


def check_spec_layers(spec: KVQuantSpec, num_layers: int) -> None:
    """QuantError when skip_layers / layer_formats name a layer the model does not have."""
    named = sorted({*spec.skip_layers, *spec.layer_formats})
    if named and named[-1] >= num_layers:
        raise QuantError(f"kv cache spec names layer {named[-1]}, but the model has {num_layers} attention "
                         f"layers (0..{num_layers - 1})")


def rewrite(plan: LayerPlan, x: torch.Tensor, kind: KVKind) -> torch.Tensor:
    """x [T, H, D] (or [T, D]) as the cache would hold it: quantized and read back in x's dtype."""
    if plan.identity or x.numel() == 0:
        return x
    _, values = quantize_dequantize(plan.fmt, x.contiguous(), plan.scale(kind, x.device), x.dtype)
    return values
