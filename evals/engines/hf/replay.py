"""Bounded replay on a model with sliding-window layers (Gemma-3: five local layers per global one), as
vLLM's SWA bounded replay does it (vllm-project/vllm PR #56227, DeepSeek-V4.1: "the SWA caches leave
prefix caching, and after a prefix hit ending at H the scheduler recomputes the hit's last window
[H-128, H) to rebuild them. The replayed tokens keep their cached KV in every other group, their window
attention reads nothing below H-128, and decode always sees a full window").

On a hit of P positions with a replay window W (W <= the sliding window):
- global (full-attention) layers hold all P cached positions; during the replay passes over [P - W, P)
  they store nothing and hand attention their cached K/V up to the pass's end (`ReadOnlyLayer`);
- sliding layers start empty at position P - W, with the cached prompt's decode scales (`emptied`), and
  store what the replay computes; they keep reporting positions from P - W on (`ShiftedLayer`), so
  transformers' masks let their attention see nothing below P - W.

The layer objects here wrap the engine's own cache layers (`quant.kv` or transformers' sliding layer) and
pass everything else through; nothing is re-quantized.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicSlidingWindowLayer

from quant.kv.layer import QuantizedKVLayer


class _Wrapped(CacheLayerMixin):
    """A cache layer that answers for `inner` (attributes it does not define are the inner layer's)."""

    def __init__(self, inner: Any) -> None:  # no super().__init__: keys / values stay the inner layer's
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy / unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def keys(self) -> Any:  # type: ignore[override]
        return self.inner.keys

    @property
    def values(self) -> Any:  # type: ignore[override]
        return self.inner.values

    @property
    def is_initialized(self) -> bool:  # type: ignore[override]
        return bool(self.inner.is_initialized)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """The inner layer's."""
        self.inner.lazy_initialization(key_states, value_states)

    def get_max_length(self) -> int:
        """The inner layer's."""
        return int(self.inner.get_max_length())

    def offload(self) -> None:
        """Not supported: the cache stays on its device."""

    def prefetch(self) -> None:
        """Not supported: the cache stays on its device."""


class ShiftedLayer(_Wrapped):
    """A sliding-window layer started empty at absolute position `offset` (a replay's first position)."""

    is_sliding = True

    def __init__(self, inner: Any, offset: int) -> None:
        super().__init__(inner)
        self.offset = offset

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The inner layer's update (it counts positions from `offset`)."""
        return self.inner.update(key_states, value_states, *args, **kwargs)

    def get_seq_length(self) -> int:
        """Absolute positions seen: the offset plus what the inner layer was written."""
        return self.offset + int(self.inner.get_seq_length())

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) of the inner layer, its offset moved to absolute positions."""
        kv_length, kv_offset = self.inner.get_mask_sizes(query_length)
        return kv_length, kv_offset + self.offset


class ReadOnlyLayer(_Wrapped):
    """A full-attention layer during a replay pass: it already holds the replayed positions (read from
    the prefix cache), stores nothing, and returns its cached K/V up to the end of the pass."""

    is_sliding = False

    def __init__(self, inner: Any, start: int) -> None:
        super().__init__(inner)
        self.pos = start  # absolute position of the pass's first token

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached K/V [B, H, end, D] of positions [0, end), end = start + the pass's tokens."""
        end = self.pos + key_states.shape[-2]
        self.pos = end
        return self.inner.keys[..., :end, :], self.inner.values[..., :end, :]

    def get_seq_length(self) -> int:
        """Positions before the pass."""
        return self.pos

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset): every position up to the pass's end, from 0."""
        return self.pos + query_length, 0


def unwrap(layer: Any) -> Any:
    """The engine's own cache layer inside any wrapper."""
    while isinstance(layer, _Wrapped):
        layer = layer.inner
    return layer


def emptied(layer: Any) -> Any:
    """A copy of a sliding-window layer holding no positions: an emulated layer keeps its decode scales
    (the cached prompt's, so replayed positions quantize as the cold run's did), a plain one is new."""
    layer = unwrap(layer)
    if isinstance(layer, QuantizedKVLayer):
        out = copy.deepcopy(layer)
        n = len(out.k)
        if n:
            out.k.drop_oldest(n)
            out.v.drop_oldest(n)
        out.cumulative_length = 0
        return out
    if isinstance(layer, DynamicSlidingWindowLayer):
        return DynamicSlidingWindowLayer(sliding_window=layer.sliding_window)
    raise TypeError(f"no empty copy of cache layer {type(layer).__name__}")


def restarted(layer: Any, offset: int) -> ShiftedLayer:
    """A sliding-window layer that starts empty at absolute position `offset` (scales kept)."""
    return ShiftedLayer(emptied(layer), offset)


@contextmanager
def read_only(cache: Any, full_layers: tuple[int, ...], start: int) -> Iterator[None]:
    """For one replay pass starting at `start`: the full-attention layers read their cached K/V."""
    saved = {i: cache.layers[i] for i in full_layers}
    for i, layer in saved.items():
        cache.layers[i] = ReadOnlyLayer(layer, start)
    try:
        yield
    finally:
        for i, layer in saved.items():
            cache.layers[i] = layer
