"""The emulated quantized KV cache: a transformers `Cache` that stores K and V as a kernel would (packed
codes, block scales, a decode scale per layer) and hands attention the dequantized values.

Each layer (`quant.kv.layer`) holds one stream (`quant.kv.stream`) for K and one for V. Scales (decode
convention, x ~ stored * d): "static" from a calibrated KVScales (amax per layer or head ->
`fmt.decode_scale_from_amax`), "constant" (one decode scale, vLLM's uncalibrated 1.0), or "dynamic":
the amax of the first write of the layer (the prefill) *per sequence* (a [B, 1, 1, 1] scale), fixed from
then on as a real cache does: decode tokens reuse it and may saturate. Per sequence, not per batch, so
an item's result does not depend on what it was batched with; `set_padding_mask` keeps left-padding
positions out of that amax. Fault presets (`quant.faults`) reach the streams as hooks.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers.cache_utils import Cache

from quant.errors import QuantError
from quant.faults import fault_hooks
from quant.formats import KVFormat
from quant.kv.layer import LayerStorage, QuantizedKVLayer
from quant.kv.rows import RowOpsMixin
from quant.kv.shape import SLIDING_LAYER_TYPES, model_kv_shape
from quant.kv.stream import StreamPlan
from quant.kv_profiles import profile_format
from quant.kv_spec import KVKind, KVQuantSpec
from quant.scales import KVScales


class QuantizedKVCache(RowOpsMixin, Cache):
    """The emulated quantized KV cache; build it with `make_cache`."""

    layers: list[QuantizedKVLayer]

    def __init__(self, layers: list[QuantizedKVLayer], spec: KVQuantSpec) -> None:
        super().__init__(layers=layers)
        self.spec = spec

    def set_padding_mask(self, attention_mask: torch.Tensor) -> None:
        """Exclude padding positions ([B, T] 0/1 mask of the first write) from dynamic per-sequence amax."""
        for layer in self.layers:
            layer.padding_mask = attention_mask.bool()

    def storage(self) -> list[LayerStorage]:
        """Per-layer stored bytes and element counts."""
        return [layer.storage(i) for i, layer in enumerate(self.layers)]

    def nbytes(self) -> int:
        """Total stored bytes (K and V of every layer)."""
        return sum(s.k_bytes + s.v_bytes for s in self.storage())

    @property
    def supports_rows(self) -> bool:
        """Whether `pad_left`, `set_row`, `drop_oldest` and `stack` work (every layer full attention)."""
        return not any(layer.is_sliding for layer in self.layers)

    @classmethod
    def stack(cls, caches: list[QuantizedKVCache]) -> QuantizedKVCache:
        """One cache holding the sequences of `caches` (same spec and length), in order."""
        per_layer = zip(*(c._rows() for c in caches), strict=True)
        return cls([QuantizedKVLayer.stack(list(layers)) for layers in per_layer],  # type: ignore[arg-type]
                   caches[0].spec)

    def clone(self) -> QuantizedKVCache:
        """An independent copy (e.g. of a few-shot prefix) that shares no tensors; nothing is re-quantized."""
        return copy.deepcopy(self)


def _check_format_fits(fmt: KVFormat, head_dim: int, where: int | str) -> None:
    """QuantError naming `where` (a layer index or "recent_format") unless fmt can store head_dim."""
    try:
        fmt.quantize(torch.ones(1, 1, 1, head_dim), None)
    except QuantError as exc:
        label = f"layer {where}" if isinstance(where, int) else where
        raise QuantError(f"{label}: format {fmt.name!r} cannot store head_dim {head_dim}: {exc}") from None


def _scale_for(
    spec: KVQuantSpec, scales: KVScales | None, fmt: KVFormat, layer: int, kind: KVKind
) -> torch.Tensor | None:
    """Static or constant decode scale of one stream (before any fault hook), None when dynamic."""
    if spec.scales == "constant":
        return torch.tensor(float(spec.constant_scale), dtype=torch.float32)  # type: ignore[arg-type]
    if spec.scales == "static":
        assert scales is not None
        return fmt.decode_scale_from_amax(scales.amax(layer, kind))
    return None


def _checked_scales(spec: KVQuantSpec, scales: KVScales | None, num_layers: int,
                    num_kv_heads: int) -> KVScales | None:
    """The static scales the spec asks for (loaded from `spec.scales_file` unless given), checked
    against the model; QuantError when they are missing, do not fit, or are given for other scales."""
    if spec.scales != "static":
        if scales is not None:
            raise QuantError(
                f"scales were given but the spec uses scales = {spec.scales!r}; set scales = 'static'"
            )
        return None
    if scales is None:
        if spec.scales_file is None:
            raise QuantError(
                "scales = 'static' needs calibrated scales: set scales_file (made by `qa calibrate`)"
            )
        scales = KVScales.load(spec.scales_file)
    if scales.num_layers != num_layers:
        raise QuantError(
            f"the scales file covers {scales.num_layers} layers, the model has {num_layers}; "
            "calibrate scales for this model"
        )
    if scales.meta.granularity == "head" and scales.meta.num_kv_heads != num_kv_heads:
        raise QuantError(
            f"the scales file has {scales.meta.num_kv_heads} KV heads per layer, the model has {num_kv_heads}"
        )
    return scales


def make_cache(model_config: Any, spec: KVQuantSpec, scales: KVScales | None = None) -> QuantizedKVCache:
    """A fresh emulated KV cache for a model config; static scales from `scales` or `spec.scales_file`."""
    shape = model_kv_shape(model_config)
    num_layers = len(shape.layer_types)
    named = sorted({*spec.skip_layers, *spec.layer_formats})
    if named and named[-1] >= num_layers:
        raise QuantError(
            f"kv cache spec names layer {named[-1]}, but the model has {num_layers} layers "
            f"(0..{num_layers - 1})"
        )
    scales = _checked_scales(spec, scales, num_layers, shape.num_kv_heads)
    recent_fmt = profile_format(None, spec.recent_format) if spec.recent_window else None
    if recent_fmt is not None:
        _check_format_fits(recent_fmt, shape.head_dim, "recent_format")
    layers: list[QuantizedKVLayer] = []
    for i, (layer_type, window) in enumerate(zip(shape.layer_types, shape.sliding_windows)):
        fmt = profile_format(spec.profile, spec.layer_format(i))
        _check_format_fits(fmt, shape.head_dim, i)
        layer_recent = None if fmt.name == "none" else recent_fmt
        kinds: tuple[KVKind, KVKind] = ("k", "v")
        k_plan, v_plan = (
            StreamPlan(
                layer=i,
                kind=kind,
                fmt=fmt,
                recent_fmt=layer_recent,
                window=0 if layer_recent is None else spec.recent_window,
                static_scale=_scale_for(spec, scales, fmt, i, kind),
                recent_static_scale=_scale_for(spec, scales, layer_recent, i, kind) if layer_recent else None,
                dynamic=spec.scales == "dynamic",
                faults=fault_hooks(spec, i, kind, fmt.name, layer_recent.name if layer_recent else None),
            )
            for kind in kinds
        )
        sliding = layer_type in SLIDING_LAYER_TYPES
        layers.append(QuantizedKVLayer(
            k_plan, v_plan, prefill_reads_quantized=spec.prefill_reads_quantized,
            sliding_window=int(window) if sliding else None,  # type: ignore[arg-type]
        ))
    return QuantizedKVCache(layers, spec)
