"""What the KV caches need to know about a model: its attention layer types, windows, KV heads, head_dim."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quant.errors import QuantError

SUPPORTED_LAYER_TYPES: tuple[str, ...] = ("full_attention", "sliding_attention", "chunked_attention")
SLIDING_LAYER_TYPES: tuple[str, ...] = ("sliding_attention", "chunked_attention")
# why both caches refuse pad_left / set_row / drop_oldest / stack on a model with sliding-window layers
ROWS_NEED_FULL_ATTENTION = "row operations need full-attention layers; this model has sliding-window layers"


@dataclass(frozen=True)
class ModelKVShape:
    """What the cache needs to know about a model's attention layers."""

    layer_types: tuple[str, ...]
    sliding_windows: tuple[int | None, ...]  # window size of each sliding layer, None for full attention
    num_kv_heads: int
    head_dim: int


def model_kv_shape(model_config: Any) -> ModelKVShape:
    """Layer types, windows, KV heads and head_dim of a decoder-only model; QuantError if unsupported."""
    if getattr(model_config, "is_encoder_decoder", False):
        raise QuantError(
            f"model type {model_config.model_type!r} is encoder-decoder; the quantized KV cache "
            "supports decoder-only models"
        )
    cfg = model_config.get_text_config(decoder=True)
    num_layers = getattr(cfg, "num_hidden_layers", None)
    heads = getattr(cfg, "num_attention_heads", None)
    if not num_layers or not heads:
        raise QuantError(
            f"model type {cfg.model_type!r}: no num_hidden_layers / num_attention_heads in its config; "
            "the quantized KV cache supports transformers decoder-only attention models"
        )
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs  # transformers: layer types

        types, kwargs = get_layer_types_and_kwargs(cfg)
        windows = [kw.get("sliding_window") for kw in kwargs]
    except (ImportError, AttributeError):  # older transformers: infer from the config
        types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * num_layers)
        windows = [getattr(cfg, "sliding_window", None) if t in SLIDING_LAYER_TYPES else None for t in types]
    bad = sorted(set(types) - set(SUPPORTED_LAYER_TYPES))
    if bad:
        raise QuantError(
            f"model type {cfg.model_type!r} has layer types {bad}; the quantized KV cache supports "
            f"{', '.join(SUPPORTED_LAYER_TYPES)} layers only"
        )
    missing = next((i for i, (t, w) in enumerate(zip(types, windows)) if t in SLIDING_LAYER_TYPES and not w), None)
    if missing is not None:
        raise QuantError(f"layer {missing} is {types[missing]} but the config has no window size")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    return ModelKVShape(tuple(types), tuple(windows), int(kv_heads), int(head_dim))
