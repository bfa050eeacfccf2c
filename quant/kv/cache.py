"""The emulated quantized KV cache: a transformers `Cache` that stores K and V as a kernel would (packed
codes, block scales, a decode scale per layer) and hands attention the dequantized values.

Each layer (`quant.kv.layer`) holds one stream (`quant.kv.stream`) for K and one for V. Scales (decode
convention, x ~ stored * d): "static" from a calibrated KVScales (amax per layer or head ->
`fmt.decode_scale_from_amax`), "constant" (one decode scale, vLLM's uncalibrated 1.0), or "dynamic":
the amax of the first write of the layer (the prefill) *per sequence* (a [B, 1, 1, 1] scale), fixed from
then on as a real cache does: decode tokens reuse it and may saturate. Per sequence, not per batch, so
an item's result does not depend on what it was batched with; `set_padding_mask` keeps left-padding
positions out of that amax. Fault presets (`quant.kv.faults`) reach the streams as hooks.

Architectures (`quant.kv.shape`, docs/KV_ARCHITECTURES.md): full, sliding-window and chunked attention
layers are quantized; the recurrent layers of a hybrid model (qwen3_next) stay in transformers' own
unquantized layer; an MLA model's layers store its latent kv_c (K) and roped key k_pe (V) with one
shared decode scale per layer, as vLLM's MLA cache does. What the cache cannot reproduce is refused in
one line by `make_cache`: an engine profile on an MLA model, a profile's attention on a model whose
attention adds sinks or a logit soft cap, a per-token-row format on MLA, a spec naming a recurrent layer.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers.cache_utils import Cache

from quant.errors import QuantError
from quant.formats.catalog import VLLM_FORMATS
from quant.formats.registry import KVFormat, kind_format
from quant.kv.faults import fault_hooks
from quant.kv.layer import LayerStorage, QuantizedKVLayer
from quant.kv.plain import recurrent_layer
from quant.kv.profiles import get_profile, profile_format, spec_format
from quant.kv.rows import RowOpsMixin
from quant.kv.shape import RECURRENT_LAYER_TYPES, SLIDING_LAYER_TYPES, ModelKVShape, model_kv_shape
from quant.kv.skip_layers import config_layers, skip_indices
from quant.kv.spec import KVKind, KVQuantSpec
from quant.kv.stream import StreamPlan
from quant.scales.files import KVScales

# formats with one scale per (token, head) row: an MLA entry [kv_c | k_pe] is one row, with one scale, where
# the emulator's two streams would have two (block formats keep blocks inside kv_c or k_pe: widths % block)
PER_ROW_FORMATS: tuple[str, ...] = ("qa_int8", "qa_int4", *VLLM_FORMATS)  # vLLM's: per (token, head) row


class QuantizedKVCache(RowOpsMixin, Cache):
    """The emulated quantized KV cache; build it with `make_cache`."""

    layers: list[Any]  # QuantizedKVLayer, or transformers' own layer for a recurrent one

    def __init__(self, layers: list[Any], spec: KVQuantSpec) -> None:
        super().__init__(layers=layers)
        self.spec = spec

    def set_padding_mask(self, attention_mask: torch.Tensor) -> None:
        """Exclude padding positions ([B, T] 0/1 mask of the first write) from dynamic per-sequence amax."""
        for layer in self.layers:
            if isinstance(layer, QuantizedKVLayer):
                layer.padding_mask = attention_mask.bool()

    def storage(self) -> list[LayerStorage]:
        """Stored bytes and element counts of each KV layer (recurrent layers hold no KV cache)."""
        return [layer.storage(i) for i, layer in enumerate(self.layers) if isinstance(layer, QuantizedKVLayer)]

    def nbytes(self) -> int:
        """Total stored bytes (K and V of every layer)."""
        return sum(s.k_bytes + s.v_bytes for s in self.storage())

    @property
    def supports_rows(self) -> bool:
        """Whether `pad_left`, `set_row`, `drop_oldest` and `stack` work (every layer full attention)."""
        return all(isinstance(layer, QuantizedKVLayer) and not layer.is_sliding for layer in self.layers)

    @classmethod
    def stack(cls, caches: list[QuantizedKVCache]) -> QuantizedKVCache:
        """One cache holding the sequences of `caches` (same spec and length), in order."""
        per_layer = zip(*(c._rows() for c in caches), strict=True)
        return cls([QuantizedKVLayer.stack(list(layers)) for layers in per_layer],  # type: ignore[arg-type]
                   caches[0].spec)

    def clone(self) -> QuantizedKVCache:
        """An independent copy (e.g. of a few-shot prefix) that shares no tensors; nothing is re-quantized."""
        return copy.deepcopy(self)


def _check_format_fits(fmt: KVFormat, shape: ModelKVShape, where: int | str) -> None:
    """QuantError naming `where` (a layer index or "recent_format") unless fmt can store K and V."""
    label = f"layer {where}" if isinstance(where, int) else where
    if shape.mla and fmt.name in PER_ROW_FORMATS:
        raise QuantError(
            f"{label}: format {fmt.name!r} quantizes each token's row as one unit (its scale, zero point or "
            "rotation spans the row), but an MLA entry is one row [kv_c | k_pe] that the emulator stores as two; "
            "use nvfp4, qa_mxfp4 or fp8"
        )
    for kind, width in (("K", shape.k_head_dim), ("V", shape.v_head_dim)):
        try:
            fmt.quantize(torch.ones(1, 1, 1, width), None)
        except QuantError as exc:
            what = "head_dim" if not shape.mla else ("kv_lora_rank" if kind == "K" else "qk_rope_head_dim")
            raise QuantError(f"{label}: format {fmt.name!r} cannot store {kind} of {what} {width}: {exc}") from None


def _check_profile_fits(spec: KVQuantSpec, shape: ModelKVShape, model_type: str) -> None:
    """QuantError when the spec's engine profile emulates an attention kernel that this model's attention
    is not: MLA (the engine attends in the latent space), or sinks / a logit soft cap that the profile's
    attention function would drop."""
    if spec.profile is None:
        return
    if shape.mla:
        raise QuantError(
            f"profile {spec.profile!r} emulates an MHA/GQA attention kernel; model type {model_type!r} is MLA "
            "(the engine attends over the latent cache), which no profile emulates: drop profile"
        )
    p = get_profile(spec.profile)
    if spec.format != "none" and (p.amx_flush or p.query != "none") and shape.attention_extras:
        raise QuantError(
            f"profile {spec.profile!r} replaces the attention function, and model type {model_type!r} attends with "
            f"{' and '.join(shape.attention_extras)}, which that function does not do: drop profile"
        )


def scale_for(
    spec: KVQuantSpec, scales: KVScales | None, fmt: KVFormat, layer: int, kind: KVKind, shared: bool = False
) -> torch.Tensor | None:
    """Static or constant decode scale of one stream (before any fault hook), None when dynamic; `shared`
    (MLA): one static scale for K and V, from the larger of their calibrated amax. The hf cache and the vLLM
    plugin (evals.engines.vllm.kv.emulate) both take their scales from here."""
    if spec.scales == "constant":
        return torch.tensor(float(spec.constant_scale), dtype=torch.float32)  # type: ignore[arg-type]
    if spec.scales == "static":
        assert scales is not None
        if shared:
            return fmt.decode_scale_from_amax(torch.maximum(scales.amax(layer, "k"), scales.amax(layer, "v")))
        return fmt.decode_scale_from_amax(scales.amax(layer, kind))
    return None


def spec_scales(spec: KVQuantSpec, scales: KVScales | None = None) -> KVScales | None:
    """The static scales the spec asks for (loaded from `spec.scales_file` unless given; None unless scales =
    'static'); QuantError when they are missing or given for other scales."""
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
        # a file pair, or a model folder read for the spec's format, taken as it is where the spec says so
        scales = KVScales.load(spec.scales_file, kv_format=spec.format, take_as_is=spec.scales_as_is)
    return scales


def check_scales_fit(scales: KVScales | None, num_layers: int, num_kv_heads: int) -> None:
    """QuantError when static scales do not cover the model's layers (or its KV heads, per-head scales)."""
    if scales is None:
        return
    if scales.num_layers != num_layers:
        raise QuantError(
            f"the scales file covers {scales.num_layers} layers, the model has {num_layers}; "
            "calibrate scales for this model"
        )
    if scales.meta.granularity == "head" and scales.meta.num_kv_heads != num_kv_heads:
        raise QuantError(
            f"the scales file has {scales.meta.num_kv_heads} KV heads per layer, the model has {num_kv_heads}; "
            "calibrate scales for this model"
        )


def check_named_layers(spec: KVQuantSpec, num_layers: int) -> None:
    """QuantError when skip_layers / layer_formats name a layer the model does not have."""
    named = sorted({*skip_indices(spec.skip_layers), *spec.layer_formats})
    if named and named[-1] >= num_layers:
        raise QuantError(
            f"kv cache spec names layer {named[-1]}, but the model has {num_layers} layers "
            f"(0..{num_layers - 1})"
        )


def make_cache(model_config: Any, spec: KVQuantSpec, scales: KVScales | None = None) -> QuantizedKVCache:
    """A fresh emulated KV cache for a model config; static scales from `scales` or `spec.scales_file`."""
    shape = model_kv_shape(model_config, recurrent_ok=True)
    num_layers = len(shape.layer_types)
    check_named_layers(spec, num_layers)
    named = sorted({*skip_indices(spec.skip_layers), *spec.layer_formats})
    recurrent = [i for i in named if shape.layer_types[i] in RECURRENT_LAYER_TYPES]
    if recurrent:
        raise QuantError(
            f"kv cache spec names layer {recurrent[0]}, a {shape.layer_types[recurrent[0]]} layer: it holds a "
            "recurrent state, not a KV cache, and stays unquantized"
        )
    model_type = str(model_config.get_text_config(decoder=True).model_type)
    _check_profile_fits(spec, shape, model_type)
    scales = spec_scales(spec, scales)
    check_scales_fit(scales, num_layers, shape.num_kv_heads)
    recent_fmt = profile_format(None, spec.recent_format) if spec.recent_window else None
    if recent_fmt is not None:
        _check_format_fits(recent_fmt, shape, "recent_format")
    prefix_cache = spec.prefix_cache is not None and spec.prefix_cache.enabled  # its hits crop caches exactly
    skips = spec.layer_skips(config_layers(model_config.get_text_config(decoder=True)))  # as vLLM resolves them
    layers: list[Any] = []
    fitting: set[str] = set()  # formats already checked against this shape (the first layer that uses each)
    for i, (layer_type, window) in enumerate(zip(shape.layer_types, shape.sliding_windows)):
        if layer_type in RECURRENT_LAYER_TYPES:
            layers.append(recurrent_layer(model_config, layer_type))
            continue
        fmt = spec_format(spec, i, skips)
        if fmt.name not in fitting:
            _check_format_fits(fmt, shape, i)
            fitting.add(fmt.name)
        layer_recent = None if fmt.name == "none" else recent_fmt
        kinds: tuple[KVKind, KVKind] = ("k", "v")
        k_plan, v_plan = (
            StreamPlan(
                layer=i,
                kind=kind,
                fmt=kind_format(fmt, kind),  # TurboQuant stores K and V differently
                recent_fmt=layer_recent,
                window=0 if layer_recent is None else spec.recent_window,
                static_scale=scale_for(spec, scales, fmt, i, kind, shape.mla),
                recent_static_scale=(
                    scale_for(spec, scales, layer_recent, i, kind, shape.mla) if layer_recent else None
                ),
                dynamic=spec.scales == "dynamic",
                faults=fault_hooks(spec, i, kind, fmt.name, layer_recent.name if layer_recent else None),
                rollback=prefix_cache,
            )
            for kind in kinds
        )
        sliding = layer_type in SLIDING_LAYER_TYPES
        layers.append(QuantizedKVLayer(
            k_plan, v_plan, prefill_reads_quantized=spec.prefill_reads_quantized,
            sliding_window=int(window) if sliding else None,  # type: ignore[arg-type]
            shared_scale=shape.mla, expected=(shape.num_kv_heads, shape.k_head_dim, shape.v_head_dim),
        ))
    return QuantizedKVCache(layers, spec)
