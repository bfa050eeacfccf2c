"""What the KV caches need to know about a model: its layer types, windows, what each attention layer
writes to the cache (heads, K and V widths), and what its attention does beyond reading the cache.

Layouts (transformers >= 5.2x, checked on tiny configs of every family in docs/KV_ARCHITECTURES.md):
- multi-head / grouped-query attention: K and V [B, num_key_value_heads, T, head_dim] (V as wide as K
  unless the config has its own `v_head_dim`); full, sliding-window or chunked layers.
- multi-head latent attention (MLA: deepseek_v2, deepseek_v3): the layer caches what vLLM's MLA cache
  stores, the compressed latent kv_c (after kv_a_layernorm) as "K" [B, 1, T, kv_lora_rank] and the
  roped key k_pe as "V" [B, 1, T, qk_rope_head_dim]; K and V are up-projected after the cache read.
- recurrent layers of hybrid models (qwen3_next `linear_attention`, `conv`): a state, not a KV cache;
  the caches keep them in transformers' own unquantized layer (vLLM's kv cache dtype does not reach
  them either). `model_kv_shape` refuses them unless the caller asks for them (`recurrent_ok`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quant.errors import QuantError

SUPPORTED_LAYER_TYPES: tuple[str, ...] = ("full_attention", "sliding_attention", "chunked_attention")
SLIDING_LAYER_TYPES: tuple[str, ...] = ("sliding_attention", "chunked_attention")
RECURRENT_LAYER_TYPES: tuple[str, ...] = ("linear_attention", "conv")  # kept unquantized by both caches
# MLA models whose attention hands cache.update the latent (kv_c, k_pe), read in their modeling files
MLA_MODEL_TYPES: tuple[str, ...] = ("deepseek_v2", "deepseek_v3")
# models whose attention adds learned sinks (s_aux) to the softmax, by transformers' modeling files
SINK_MODEL_TYPES: tuple[str, ...] = ("gpt_oss",)
# why both caches refuse pad_left / set_row / drop_oldest / stack on a model with sliding-window layers
ROWS_NEED_FULL_ATTENTION = (
    "row operations need full-attention layers; this model has sliding-window or recurrent layers"
)


@dataclass(frozen=True)
class ModelKVShape:
    """What the cache needs to know about a model's layers and what its attention layers write."""

    layer_types: tuple[str, ...]
    sliding_windows: tuple[int | None, ...]  # window size of each sliding layer, None for the others
    num_kv_heads: int  # heads of the cached K / V (1 for MLA)
    k_head_dim: int  # width of the cached K (MLA: kv_lora_rank)
    v_head_dim: int  # width of the cached V (MLA: qk_rope_head_dim)
    mla: bool = False  # the cached K / V are MLA's latent kv_c and roped key k_pe
    attention_extras: tuple[str, ...] = ()  # what attention does beyond the cache ("learned sinks", ...)

    @property
    def head_dim(self) -> int:
        """Width of the cached K (that of V too, except for MLA or a config with its own v_head_dim)."""
        return self.k_head_dim

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Indices of the layers that hold a KV cache (not recurrent ones)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t not in RECURRENT_LAYER_TYPES)


def _layer_types(cfg: Any, num_layers: int) -> tuple[list[str], list[int | None]]:
    """Each layer's type and window as transformers' DynamicCache reads them off the config."""
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs  # transformers: layer types

        types, kwargs = get_layer_types_and_kwargs(cfg)
        return list(types), [kw.get("sliding_window") for kw in kwargs]
    except (ImportError, AttributeError):  # older transformers: infer from the config
        types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * num_layers)
        windows = [getattr(cfg, "sliding_window", None) if t in SLIDING_LAYER_TYPES else None for t in types]
        return types, windows


def _attention_layout(cfg: Any, heads: int) -> tuple[int, int, int, bool]:
    """(cached heads, K width, V width, mla) of the config's attention layers; QuantError for a latent
    attention this module has not been checked on."""
    if getattr(cfg, "kv_lora_rank", None):
        if cfg.model_type not in MLA_MODEL_TYPES:
            raise QuantError(
                f"model type {cfg.model_type!r} has latent attention (kv_lora_rank); the quantized KV cache "
                f"is checked on the MLA cache of {', '.join(MLA_MODEL_TYPES)} only"
            )
        return 1, int(cfg.kv_lora_rank), int(cfg.qk_rope_head_dim), True
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    return kv_heads, head_dim, int(getattr(cfg, "v_head_dim", None) or head_dim), False


def model_kv_shape(model_config: Any, *, recurrent_ok: bool = False) -> ModelKVShape:
    """Layer types, windows, cached heads and widths of a decoder-only model; QuantError if unsupported
    (recurrent layers too, unless `recurrent_ok`: the caches keep them, other steps need a KV cache)."""
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
    types, windows = _layer_types(cfg, num_layers)
    allowed = SUPPORTED_LAYER_TYPES + (RECURRENT_LAYER_TYPES if recurrent_ok else ())
    bad = sorted(set(types) - set(allowed))
    if bad:
        recurrent = [t for t in bad if t in RECURRENT_LAYER_TYPES]
        if recurrent and len(recurrent) == len(bad):
            layers = [i for i, t in enumerate(types) if t in RECURRENT_LAYER_TYPES]
            raise QuantError(
                f"model type {cfg.model_type!r}: layers {layers} are {'/'.join(recurrent)} (a recurrent "
                "state, not a KV cache); this step needs attention layers only"
            )
        raise QuantError(
            f"model type {cfg.model_type!r} has layer types {bad}; the quantized KV cache supports "
            f"{', '.join(allowed)} layers only"
        )
    missing = next((i for i, (t, w) in enumerate(zip(types, windows)) if t in SLIDING_LAYER_TYPES and not w), None)
    if missing is not None:
        raise QuantError(f"layer {missing} is {types[missing]} but the config has no window size")
    kv_heads, k_dim, v_dim, mla = _attention_layout(cfg, int(heads))
    extras = (("learned sinks",) if cfg.model_type in SINK_MODEL_TYPES else ()) + (
        ("a logit soft cap",) if getattr(cfg, "attn_logit_softcapping", None) else ()
    )
    windows = [w if t in SLIDING_LAYER_TYPES else None for t, w in zip(types, windows)]
    return ModelKVShape(tuple(types), tuple(windows), kv_heads, k_dim, v_dim, mla, extras)
