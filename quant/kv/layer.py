"""One layer of the emulated quantized KV cache: K and V streams, what attention reads, row operations.

A layer is full attention (`sliding_window` None) or sliding-window (Gemma-3 local attention: it keeps
the last `sliding_window - 1` tokens). The row operations (`pad_left`, `drop_oldest`, `set_row`,
`stack`) right-align sequences prefilled one by one into a decode batch; they need full attention and
`_require_rows` refuses them for a sliding-window layer (the cache checks all layers first).

`prefill_reads_quantized=False` lets a multi-token write (a prefill chunk) attend to its own fresh K/V
plus the quantized past; single-token decode steps always read the cache. K and V whose plans agree
go through one quantize / dequantize call each per write (the joint path: the same bytes as two calls).

K and V may differ in width (MLA caches the latent kv_c as K and the roped key k_pe as V): each stream
quantizes its own. `shared_scale` gives both one dynamic decode scale (the amax of both), as vLLM's MLA
cache writes [kv_c | k_pe] as one entry with one k_scale. `expected` ((heads, K width, V width) from the
config) is checked at the first write, so a model that writes another layout is refused, not mis-stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from transformers.cache_utils import DynamicLayer

from quant.errors import QuantError
from quant.formats.registry import KVFormat, QuantizedTensor, quantize_dequantize
from quant.kv.qtensor import scale_as_4d
from quant.kv.rows import BatchOpsMixin
from quant.kv.shape import ROWS_NEED_FULL_ATTENTION
from quant.kv.stream import Stream, StreamPlan, window_split

ScaleSlot = Literal["scale", "recent_scale"]  # which decode scale of a stream: main or recent format


@dataclass(frozen=True)
class LayerStorage:
    """Bytes the cache holds for one layer (quantized codes, block scales, decode scales)."""

    layer: int
    format: str
    k_bytes: int
    v_bytes: int
    k_elements: int  # stored K values (batch * heads * tokens * head_dim)
    v_elements: int


class QuantizedKVLayer(BatchOpsMixin, DynamicLayer):
    """One layer of the emulated cache: K and V stored quantized, read dequantized."""

    def __init__(self, k_plan: StreamPlan, v_plan: StreamPlan, prefill_reads_quantized: bool = True,
                 sliding_window: int | None = None, *, shared_scale: bool = False,
                 expected: tuple[int, int, int] | None = None) -> None:
        super().__init__()
        self.k = Stream(k_plan)
        self.v = Stream(v_plan)
        self.prefill_reads_quantized = prefill_reads_quantized
        self.sliding_window = sliding_window
        self.is_sliding = sliding_window is not None
        self.shared_scale = shared_scale
        self.expected = expected
        self.cumulative_length = 0
        self.padding_mask: torch.Tensor | None = None  # [B, T_first] bool, for dynamic amax only
        self._joint_scales: dict[ScaleSlot, tuple] = {}  # slot -> (K scale, V scale, both stacked)
        # a recent window is rolled back exactly only with its trail (quant.kv.stream), a sliding window
        # never (evicted tokens are gone)
        self.is_croppable = (k_plan.window == 0 or k_plan.rollback) and not self.is_sliding

    @property
    def format(self) -> str:
        """Main storage format of this layer."""
        return self.k.plan.fmt.name

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Record device and dtype (storage starts empty); QuantError when K/V are not the expected layout."""
        if self.expected is not None:
            heads, k_dim, v_dim = self.expected
            got = (key_states.shape[1], key_states.shape[-1], value_states.shape[-1])
            if key_states.dim() != 4 or value_states.shape[1] != got[0] or got != self.expected:
                raise QuantError(
                    f"layer {self.k.plan.layer} writes K {tuple(key_states.shape)} and V "
                    f"{tuple(value_states.shape)}, but its config describes {heads} heads of K width {k_dim} "
                    f"and V width {v_dim}; the quantized KV cache does not know this attention layout"
                )
        self.device = key_states.device
        self.keys = key_states[..., :0, :]
        self.values = value_states[..., :0, :]
        self.is_initialized = True

    def _views(self) -> None:
        self.keys, self.values = self.k.view(), self.v.view()

    # ---- writing ----
    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store K/V [B, H, n, D] quantized; return everything attention sees (dequantized), oldest first;
        a sliding-window layer then evicts down to its last `sliding_window - 1` tokens."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if not self.k.scales_ready and n:
            valid = self.padding_mask
            if valid is not None and tuple(valid.shape) != (key_states.shape[0], n):
                valid = None  # the mask was for another batch or prompt length
            if self.shared_scale:  # one decode scale for the whole [K | V] entry (MLA)
                amax = torch.maximum(self.k.dynamic_amax(key_states, valid), self.v.dynamic_amax(value_states, valid))
                self.k.set_dynamic_scales(amax)
                self.v.set_dynamic_scales(amax)
            else:
                self.k.init_dynamic_scales(key_states, valid)
                self.v.init_dynamic_scales(value_states, valid)
        if self._joint:
            self._append_joint(key_states, value_states)
        else:
            self.k.append(key_states)
            self.v.append(value_states)
        self.cumulative_length += n
        self._views()
        keys, values = self.keys, self.values
        if not self.prefill_reads_quantized and n > 1:
            keys = torch.cat([keys[..., : keys.shape[-2] - n, :], key_states], dim=-2)
            values = torch.cat([values[..., : values.shape[-2] - n, :], value_states], dim=-2)
        if self.sliding_window is not None:
            excess = len(self.k) - (self.sliding_window - 1)
            if excess > 0:
                self.k.drop_oldest(excess)
                self.v.drop_oldest(excess)
                self._views()
        return keys, values  # type: ignore[return-value]

    @property
    def _joint(self) -> bool:
        """K and V can go through one quantize / dequantize call each (fewer kernel launches per step)."""
        pk, pv = self.k.plan, self.v.plan
        return (
            pk.fmt.name == pv.fmt.name
            and pk.window == pv.window
            and getattr(pk.recent_fmt, "name", None) == getattr(pv.recent_fmt, "name", None)
            and self.k.exact_readback
            and self.v.exact_readback
        )

    def _pair_scale(self, slot: ScaleSlot) -> torch.Tensor | None:
        """The K and V decode scales `slot` stacked [2, B|1, H|1, 1, 1]."""
        dk, dv = getattr(self.k, slot), getattr(self.v, slot)
        cached = self._joint_scales.get(slot)
        if cached is None or cached[0] is not dk or cached[1] is not dv:  # scales set or remapped since
            d = None
            if dk is not None and dv is not None:
                d = torch.stack(torch.broadcast_tensors(scale_as_4d(dk), scale_as_4d(dv)))
            cached = self._joint_scales[slot] = (dk, dv, d)
        return cached[2]

    def _quantize_pair(
        self, fmt: KVFormat, slot: ScaleSlot, pair: torch.Tensor
    ) -> tuple[list[QuantizedTensor], torch.Tensor]:
        """Quantize K and V stacked [2, B, H, n, D] with their own decode scales: the two streams'
        QuantizedTensors (the same bytes as two calls) and the dequantized pair in model dtype."""
        dtype: torch.dtype = self.k.dtype  # type: ignore[assignment]
        q, new = quantize_dequantize(fmt, pair, self._pair_scale(slot), dtype)
        parts = [
            QuantizedTensor(q.format, tuple(pair.shape[1:]), {key: t[i] for key, t in q.data.items()},
                            getattr(stream, slot))
            for i, stream in enumerate((self.k, self.v))
        ]
        return parts, new

    def _append_joint(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """`Stream.append` for K and V together: same regions, window moves and bytes, half the calls."""
        if key_states.shape != value_states.shape or key_states.dtype != value_states.dtype:
            self.k.append(key_states)
            self.v.append(value_states)
            return
        k, v = self.k, self.v
        k.dtype = v.dtype = key_states.dtype
        x = torch.stack([key_states, value_states])  # [2, B, H, n, D]
        n, window, fmt = x.shape[-2], k.plan.window, k.plan.fmt
        if window == 0:
            if n or not k.allocated:
                parts, new = self._quantize_pair(fmt, "scale", x)
                k.add_main_chunk(parts[0], new[0])
                v.add_main_chunk(parts[1], new[1])
            return
        recent_fmt = k.plan.recent_fmt
        assert recent_fmt is not None
        move, direct = window_split(k.recent_len, n, window)
        if move:  # oldest recent tokens leave the window: re-quantize their stored values
            leaving = [s.take_oldest_recent(move) for s in (k, v)]
            data = {key: torch.stack([q.data[key] for q in leaving]) for key in leaving[0].data}
            stacked = replace(leaving[0], shape=(2, *leaving[0].shape), data=data,
                              scale=self._pair_scale("recent_scale"))  # [2, B, H, move, ...]
            parts, new = self._quantize_pair(fmt, "scale", recent_fmt.dequantize(stacked, torch.float32))
            for i, s in enumerate((k, v)):
                s.add_main_chunk(parts[i], new[i], from_recent=True)
        if direct:  # new tokens already older than the window: straight to the main format
            k.trail_direct(key_states[..., :direct, :])
            v.trail_direct(value_states[..., :direct, :])
            parts, new = self._quantize_pair(fmt, "scale", x[..., :direct, :])
            k.add_main_chunk(parts[0], new[0])
            v.add_main_chunk(parts[1], new[1])
        if n - direct or not k.allocated:
            parts, new = self._quantize_pair(recent_fmt, "recent_scale", x[..., direct:, :])
            for i, s in enumerate((k, v)):
                s.add_recent_chunk(parts[i], new[i])

    # ---- lengths and masks ----
    def get_seq_length(self) -> int:
        """Tokens written so far."""
        return self.cumulative_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) for the attention mask (as DynamicSlidingWindowLayer for a window)."""
        if self.sliding_window is None:
            return self.cumulative_length + query_length, 0
        kv_offset = max(self.cumulative_length - self.sliding_window + 1, 0)
        if self.cumulative_length >= self.sliding_window:
            return self.sliding_window - 1 + query_length, kv_offset
        return self.cumulative_length + query_length, kv_offset

    def get_max_length(self) -> int:
        """The window size of a sliding-window layer; -1 (no limit) for full attention."""
        return -1 if self.sliding_window is None else self.sliding_window

    # ---- removing tokens ----
    def reset(self) -> None:
        """Drop all stored tokens and dynamic scales."""
        self.k.reset()
        self.v.reset()
        self.keys = self.values = None
        self.is_initialized = False
        self.cumulative_length = 0

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last |tokens_to_remove| tokens (negative count, as DynamicLayer.crop); a
        sliding-window layer only while nothing was evicted."""
        evicted = self.sliding_window is not None and self.cumulative_length >= self.sliding_window
        if evicted and tokens_to_remove:
            raise QuantError("cannot crop a sliding-window layer of the quantized cache past its window")
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        n = min(abs(tokens_to_remove), self.cumulative_length)
        if n == 0 or not self.is_initialized:
            return
        self.k.drop_latest(n)
        self.v.drop_latest(n)
        self.cumulative_length -= n
        self._views()

    def _map_batch(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        if not self.is_initialized:
            return
        self.k.map_batch(fn)
        self.v.map_batch(fn)
        self._views()

    # ---- rows: sequences prefilled one by one, decoded as a right-aligned batch ----
    def _require_rows(self) -> None:
        """Raise QuantError unless the row operations are supported (full attention)."""
        if self.is_sliding:
            raise QuantError(ROWS_NEED_FULL_ATTENTION)

    def pad_left(self, n: int) -> None:
        """Put n zero tokens (masked by the caller) before every sequence's oldest token."""
        self._require_rows()
        if n <= 0 or not self.is_initialized:
            return
        self.k.pad_left(n)
        self.v.pad_left(n)
        self.cumulative_length += n
        self._views()

    def drop_oldest(self, n: int) -> None:
        """Forget the n oldest token positions of every sequence (positions that are padding for all)."""
        self._require_rows()
        if n <= 0 or not self.is_initialized:
            return
        self.k.drop_oldest(n)
        self.v.drop_oldest(n)
        self.cumulative_length -= n
        self._views()

    def set_row(self, row: int, other: QuantizedKVLayer) -> None:
        """Overwrite sequence `row` with `other`'s single sequence of the same length."""
        self._require_rows()
        self.k.set_row(row, other.k)
        self.v.set_row(row, other.v)
        self._views()

    @classmethod
    def stack(cls, layers: list[QuantizedKVLayer]) -> QuantizedKVLayer:
        """One layer holding the sequences of `layers` (same plans and lengths), in order."""
        for layer in layers:
            layer._require_rows()
        first = layers[0]
        out = cls(first.k.plan, first.v.plan, first.prefill_reads_quantized,
                  shared_scale=first.shared_scale, expected=first.expected)
        out.k = Stream.stack([layer.k for layer in layers])
        out.v = Stream.stack([layer.v for layer in layers])
        out.device, out.is_initialized, out.cumulative_length = first.device, True, first.cumulative_length
        out._views()
        return out

    # ---- device and inspection ----
    def offload(self) -> None:
        """Not supported: the emulated cache stays on its device."""

    def prefetch(self) -> None:
        """Not supported: the emulated cache stays on its device."""

    def storage(self, layer: int) -> LayerStorage:
        """Bytes and element counts of this layer's stored K and V."""
        return LayerStorage(
            layer=layer,
            format=self.format,
            k_bytes=self.k.nbytes(),
            v_bytes=self.v.nbytes(),
            k_elements=self.k.elements(),
            v_elements=self.v.elements(),
        )
