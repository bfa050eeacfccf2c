"""The per-layer K/V rewrite the vLLM plugin runs before vLLM stores K and V: the values
quant.formats.registry's quantize -> dequantize gives (`quantize_dequantize(fmt, x, scale, x.dtype)[1]`, what
the hf engine's emulated cache stores, quant.kv.stream), computed by quant.formats.capture: capture-safe.

vLLM hands an attention layer K [T, H, D] and V [T, H, Dv] (T: the tokens of every sequence in the
step); an MLA layer the latent kv_c [T, Dc] and the rope key k_pe [T, 1, Dr], rewritten as K and V of one
head with one shared decode scale, as the hf engine's MLA cache stores them (quant.kv.layer). Decode
scales: static from the scales the hf engine reads (quant.scales.files.KVScales.load: a `qa calibrate` file
pair, or a model folder read as its writer meant it for the spec's format), `fmt.decode_scale_from_amax(amax)`
per layer (and head) exactly as the hf cache derives them; constant; or none for the self-scaled formats
(qa_mxfp4, qa_int8, qa_int4).

Everything that reads a tensor on the host happens once, when the plan is made or moved (`layer_plan`,
`LayerPlan.to`: the scales checked, every constant built on the layer's device). A call then makes no host
read, no host-to-device copy and no Python branch on values, and raises nothing from values, so vLLM can
capture it in a CUDA graph (its default FULL_AND_PIECEWISE mode captures the cache write) and replay it:
`rewrite_pair` rewrites K and V in one call, compiled for their device (inductor: C++ on CPU, Triton on CUDA)
where it can be, eagerly otherwise (the same values). Each plan keeps a device counter `counts` (int64 [2]):
[0] the tokens written to the cache (`count_tokens`: slot_mapping >= 0, padded slots are -1), [1] the
non-finite K/V elements seen; NaN is written as NaN and Inf as the format's arithmetic takes it
(quant.formats.capture), never an exception inside the engine. A format quant.formats.capture has no rewrite
(vLLM's own per-token-head and TurboQuant caches, which vLLM stores natively) takes `quantize_dequantize`:
eager, with host reads, not capture-safe. Torch only, no vllm.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from quant.errors import QuantError
from quant.formats import capture
from quant.formats.registry import KVFormat, quantize_dequantize
from quant.kv.cache import scale_for, spec_scales
from quant.kv.profiles import spec_format
from quant.kv.skip_layers import LayerSkips
from quant.kv.spec import KVKind, KVQuantSpec
from quant.scales.files import KVScales

TOKENS, NON_FINITE = 0, 1  # the two entries of LayerPlan.counts


def _zero_counts(device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.zeros(2, dtype=torch.int64, device=device)


@dataclass(frozen=True)
class LayerPlan:
    """How one attention layer's K and V are rewritten: format and decode scales (None: self-scaled or
    unquantized; shape () or [H, 1], one per KV head, broadcast over [T, H, D]), the rewrite prepared on the
    plan's device (None: the format has no capture-safe one), and the layer's device counters
    `counts` int64 [2]: tokens written, non-finite K/V elements seen."""

    layer: int
    fmt: KVFormat
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    prepared: capture.Prepared | None = field(default=None, repr=False, compare=False)
    counts: torch.Tensor = field(default_factory=_zero_counts, repr=False, compare=False)

    @property
    def identity(self) -> bool:
        """Whether the rewrite leaves K and V as they are (format none)."""
        return self.fmt.name == "none"

    @property
    def device(self) -> torch.device:
        """Where the plan's constants and counters are, and so where its rewrites run."""
        return self.counts.device

    def to(self, device: torch.device | str) -> LayerPlan:
        """This plan with its scales and constants on `device` (the layer's, at install: nothing is copied per
        call) and fresh zero counters there."""
        k, v = (None if t is None else t.to(device) for t in (self.k_scale, self.v_scale))
        prepared = None if self.prepared is None else self.prepared.to(device)
        return replace(self, k_scale=k, v_scale=v, prepared=prepared, counts=_zero_counts(device))


def load_scales(spec: KVQuantSpec) -> KVScales | None:
    """The static scales the spec names (None unless scales = 'static'); QuantError when unreadable."""
    return spec_scales(spec)


def layer_plan(spec: KVQuantSpec, scales: KVScales | None, layer: int, *, mla: bool = False,
               skips: LayerSkips | None = None) -> LayerPlan:
    """The rewrite of attention layer `layer` on the CPU (`LayerPlan.to` moves it): its decode scales as the hf
    cache takes them (quant.kv.cache.scale_for; an MLA layer's K and V share one static scale), shaped [H, 1]
    for vLLM's [T, H, D] when per head, and checked here (`skips`: the spec's skip_layers resolved for the
    model, quant.kv.skip_layers); QuantError for scales the format refuses."""
    fmt = spec_format(spec, layer, skips)  # the spec's FP8 rounding applied (quant.kv.profiles)
    k = v = None
    if fmt.needs_tensor_scale:
        if spec.scales == "static" and scales is None or spec.scales == "dynamic":
            # spec.refusal keeps per-sequence dynamic scales of these formats out
            raise QuantError(f"layer {layer}: {fmt.name} needs static or constant decode scales in vLLM")
        k, v = (_per_head(scale_for(spec, scales, fmt, layer, kind, mla)) for kind in ("k", "v"))
    prepared = None if capture.family_of(fmt) is None else capture.prepare(fmt, k, v)  # None: quantize_dequantize
    return LayerPlan(layer, fmt, k, v, prepared)


def _per_head(d: torch.Tensor | None) -> torch.Tensor | None:
    """A decode scale as vLLM's [T, H, D] broadcasts it: () stays, [1, H, 1, 1] becomes [H, 1]."""
    return d.reshape(-1, 1) if d is not None and d.dim() else d


def _bad(plan: LayerPlan, count: bool) -> torch.Tensor | None:
    """The counter that receives the non-finite elements (a view: added to in place), or None."""
    return plan.counts[NON_FINITE:] if count else None


def count_tokens(plan: LayerPlan, slot_mapping: torch.Tensor) -> None:
    """Add the tokens one cache write stores (slot_mapping >= 0; padded slots are -1) to plan.counts[0], on the
    device, in place: no host read, so a CUDA graph captures it and each replay counts again."""
    plan.counts[TOKENS:NON_FINITE].add_((slot_mapping >= 0).sum())


def rewrite(plan: LayerPlan, x: torch.Tensor, kind: KVKind, *, count: bool = True) -> torch.Tensor:
    """x [T, H, D] (or [T, D]) as the cache would hold it: quantized and read back in x's dtype; with `count`
    its non-finite elements are added to plan.counts[1]."""
    if x.numel() == 0 or plan.identity and not count:
        return x
    if plan.prepared is None:
        return quantize_dequantize(plan.fmt, x.contiguous(), plan.k_scale if kind == "k" else plan.v_scale,
                                   x.dtype)[1]
    return capture.one(plan.prepared, x, kind, _bad(plan, count))


def rewrite_pair(plan: LayerPlan, key: torch.Tensor, value: torch.Tensor, *,
                 count: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewrite(plan, key, "k"), rewrite(plan, value, "v")) in one call (one compiled function for both, any
    shapes with the tokens in dim 0); with `count` their non-finite elements are added to plan.counts[1]."""
    if key.numel() == 0 and value.numel() == 0 or plan.identity and not count:
        return key, value
    if plan.prepared is None or key.numel() == 0 or value.numel() == 0:
        return rewrite(plan, key, "k", count=count), rewrite(plan, value, "v", count=count)
    return capture.pair(plan.prepared, key, value, _bad(plan, count))
