"""The unquantized KV cache of a baseline arm: transformers' DynamicCache semantics, growable buffers.

Values are stored exactly as the model computes them (no quantization); the difference from
DynamicCache is speed: K and V live in a `KVBuffer` with spare capacity, so a decode step writes one
token instead of concatenating the whole history (that concatenation was ~45% of a decode step of
SmolLM2-135M at batch 4 and 1.1k tokens). Sliding-window layers (Gemma-3 local attention) keep
transformers' own DynamicSlidingWindowLayer, the recurrent layers of a hybrid model (qwen3_next) its
LinearAttentionLayer (`recurrent_layer`, used by the quantized cache too), and such caches do not offer
the row operations.

The row operations (`pad_left`, `set_row`, `drop_oldest`, `stack`) mirror those of the quantized
cache, so both arms of a comparison batch their sequences the same way.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer

from quant.kv.buffer import KVBuffer
from quant.kv.rows import BatchOpsMixin, RowOpsMixin
from quant.kv.shape import RECURRENT_LAYER_TYPES, SLIDING_LAYER_TYPES, model_kv_shape


class PlainKVLayer(BatchOpsMixin, DynamicLayer):
    """One full-attention layer: K and V [B, H, T, D] in growable buffers, returned as views."""

    def __init__(self) -> None:
        super().__init__()
        self.k = KVBuffer()
        self.v = KVBuffer()

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Record the device; storage starts empty."""
        self.device = key_states.device
        self.is_initialized = True

    def _views(self) -> None:
        self.keys, self.values = self.k.tensor(), self.v.tensor()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Store K/V [B, H, n, D]; return every stored token (views), oldest first."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.k.append(key_states)
        self.v.append(value_states)
        self._views()
        return self.keys, self.values  # type: ignore[return-value]

    def get_seq_length(self) -> int:
        """Tokens stored."""
        return self.k.length

    def reset(self) -> None:
        """Drop all stored tokens."""
        self.k, self.v = KVBuffer(), KVBuffer()
        self.keys = self.values = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last |tokens_to_remove| tokens (negative count, as DynamicLayer.crop)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        n = min(abs(tokens_to_remove), self.k.length)
        if n and self.is_initialized:
            self.k.drop_latest(n)
            self.v.drop_latest(n)
            self._views()

    def _map_batch(self, fn: Any) -> None:
        if self.is_initialized and self.k.length:
            self.k.map_batch(fn)
            self.v.map_batch(fn)
            self._views()

    def offload(self) -> None:
        """Not supported: the cache stays on its device."""

    def prefetch(self) -> None:
        """Not supported: the cache stays on its device."""

    # -- rows --

    def pad_left(self, n: int) -> None:
        """Put n zero tokens (masked by the caller) before every sequence's oldest token."""
        if n > 0 and self.is_initialized:
            self.k.pad_left(n)
            self.v.pad_left(n)
            self._views()

    def drop_oldest(self, n: int) -> None:
        """Forget the n oldest token positions of every sequence."""
        if n > 0 and self.is_initialized:
            self.k.drop_oldest(n)
            self.v.drop_oldest(n)
            self._views()

    def set_row(self, row: int, other: PlainKVLayer) -> None:
        """Overwrite sequence `row` with `other`'s single sequence of the same length."""
        self.k.set_row(row, other.k)
        self.v.set_row(row, other.v)

    @classmethod
    def stack(cls, layers: list[PlainKVLayer]) -> PlainKVLayer:
        """One layer holding the sequences of `layers` (same length), in order."""
        out = cls()
        out.k = KVBuffer.stack([layer.k for layer in layers])
        out.v = KVBuffer.stack([layer.v for layer in layers])
        out.device, out.is_initialized = layers[0].device, True
        out._views()
        return out


class PlainKVCache(RowOpsMixin, Cache):
    """An unquantized cache for one forward batch; build it with `make_plain_cache`."""

    def __init__(self, layers: list[Any]) -> None:
        super().__init__(layers=layers)

    @property
    def supports_rows(self) -> bool:
        """Whether `pad_left`, `set_row`, `drop_oldest` and `stack` work (every layer full attention)."""
        return all(isinstance(layer, PlainKVLayer) for layer in self.layers)

    @classmethod
    def stack(cls, caches: list[PlainKVCache]) -> PlainKVCache:
        """One cache holding the sequences of `caches` (same length), in order."""
        per_layer = zip(*(c._rows() for c in caches), strict=True)
        return cls([PlainKVLayer.stack(list(layers)) for layers in per_layer])  # type: ignore[arg-type]


def recurrent_layer(model_config: Any, layer_type: str) -> Any:
    """transformers' own cache layer for a recurrent layer type (`linear_attention`, `conv`), as its
    DynamicCache builds it: the state is kept as the model computes it (no KV cache to quantize)."""
    from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING  # transformers: its layer registry

    cfg = model_config.get_text_config(decoder=True)
    return DYNAMIC_LAYER_TYPE_MAPPING[layer_type](number_of_states=getattr(cfg, "number_of_conv_states", 1))


def make_plain_cache(model_config: Any) -> PlainKVCache:
    """A fresh unquantized cache for a decoder-only model config (sliding and recurrent layers as
    transformers')."""
    shape = model_kv_shape(model_config, recurrent_ok=True)
    layers: list[Any] = []
    for layer_type, window in zip(shape.layer_types, shape.sliding_windows, strict=True):
        if layer_type in RECURRENT_LAYER_TYPES:
            layers.append(recurrent_layer(model_config, layer_type))
        elif layer_type in SLIDING_LAYER_TYPES:
            layers.append(DynamicSlidingWindowLayer(sliding_window=int(window)))  # type: ignore[arg-type]
        else:
            layers.append(PlainKVLayer())
    return PlainKVCache(layers)
