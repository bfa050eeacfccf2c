"""One cached tensor (K or V of one layer) of the emulated quantized cache: stored bytes and their shadow.

A stream keeps
- the *main* region: old tokens, in the layer's format (a list of QuantizedTensor chunks);
- the *recent* region: the last `window` tokens in `recent_fmt`; a token leaving the window is
  re-quantized to the main format from its stored recent-format value (what the cache holds);
- a dequantized shadow of both (model dtype) in one growable `KVBuffer`: new tokens are written into
  spare capacity, a token leaving the window is overwritten in place, and attention reads a view (no
  per-step concatenation). Dequantization is elementwise per block, so the shadow equals
  `dequantize(stored bytes)` exactly;
- with `plan.rollback` (a prefix cache is on), the *trail*: the recent-format bytes of every main-region
  token (those it held in the window, or would have held: a token written straight to the main format
  is quantized to the recent format too), so `drop_latest` restores exactly the regions the stream holds
  when its writes end at the shorter length: the tokens that are again among the last `window` come
  back in their recent-format bytes, not re-quantized (a prefix-cache hit inside an entry, a replay).

Faults (`quant.kv.faults.FaultHooks`, None for a clean cache) act on decode scales, on written main-format
chunks and on what is read back; the stream calls them and holds no fault logic of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from quant.errors import QuantError
from quant.formats.registry import KVFormat, QuantizedTensor, quantize_dequantize
from quant.kv.buffer import KVBuffer
from quant.kv.faults import FaultHooks
from quant.kv.qtensor import (
    cat_scale_rows,
    cat_tokens,
    data_nbytes,
    map_rows,
    repeat_token,
    scale_with_row,
    set_row,
    slice_tokens,
    stack_rows,
)
from quant.kv.spec import KVKind

CONSOLIDATE_CHUNKS = 64  # merge the main region's chunk list when it grows past this (amortized concat)


def window_split(recent_len: int, n: int, window: int) -> tuple[int, int]:
    """(move, direct) for writing n tokens after `recent_len` recent ones with a `window`-token window:
    the oldest recent tokens that leave the window (re-quantized to the main format), then the new tokens
    already older than the window (straight to the main format); the rest of the new tokens stay recent."""
    overflow = max(0, recent_len + n - window)
    move = min(overflow, recent_len)
    return move, overflow - move


@dataclass(frozen=True)
class StreamPlan:
    """How K or V of one layer is stored."""

    layer: int
    kind: KVKind
    fmt: KVFormat  # main (old-token) format
    recent_fmt: KVFormat | None  # None when window == 0
    window: int
    static_scale: torch.Tensor | None  # main decode scale, () or [1, H, 1, 1]; None = dynamic
    recent_static_scale: torch.Tensor | None
    dynamic: bool  # scales from the first write, per sequence
    faults: FaultHooks | None = None  # None: a correct cache
    rollback: bool = False  # keep the trail (recent-format bytes of main tokens) so a crop is exact


class Stream:
    """K or V of one layer: quantized main + recent regions and their dequantized shadow."""

    def __init__(self, plan: StreamPlan) -> None:
        self.plan = plan
        self.reset()

    def reset(self) -> None:
        """Drop every stored token; dynamic scales are chosen again at the next write."""
        self.main: list[QuantizedTensor] = []
        self.recent: QuantizedTensor | None = None
        self.trail: list[QuantizedTensor] = []  # recent-format bytes of the main tokens (rollback only)
        self.shadow = KVBuffer()  # dequantized main tokens, then recent tokens (model dtype)
        self._main_len = 0
        self.scale: torch.Tensor | None = self._static(self.plan.fmt, self.plan.static_scale)
        recent_fmt = self.plan.recent_fmt
        self.recent_scale: torch.Tensor | None = (
            self._static(recent_fmt, self.plan.recent_static_scale) if recent_fmt else None
        )
        self.scales_ready = not self.plan.dynamic
        self.writes = 0  # quantized main chunks written so far (seeds corruption)
        self.dtype: torch.dtype | None = None

    def _static(self, fmt: KVFormat, d: torch.Tensor | None) -> torch.Tensor | None:
        if not fmt.needs_tensor_scale or d is None:
            return None
        return self._faulty_scale(d)

    def _faulty_scale(self, d: torch.Tensor) -> torch.Tensor:
        return d if self.plan.faults is None else self.plan.faults.scale(d)

    @property
    def exact_readback(self) -> bool:
        """Stored bytes are read back as written (no fault alters them), so quantize and dequantize may
        run as one call."""
        return self.plan.faults is None or not self.plan.faults.alters_bytes

    # ---- lengths and views ----
    @property
    def main_len(self) -> int:
        """Tokens in the main (old-token) region."""
        return self._main_len

    @property
    def recent_len(self) -> int:
        """Tokens in the recent window."""
        return self.shadow.length - self._main_len

    @property
    def allocated(self) -> bool:
        """Whether anything (even zero tokens) was written since the last reset."""
        return self.shadow.buf is not None

    def __len__(self) -> int:
        return self.shadow.length

    def view(self) -> torch.Tensor:
        """Dequantized stored tokens [B, H, T, D] in model dtype, oldest first (a view of the shadow)."""
        out = self.shadow.tensor()
        assert out is not None, "view() before the first write"
        return out

    # ---- writing ----
    def dynamic_amax(self, x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """Per-sequence amax [B, 1, 1, 1] over heads, tokens and dims of x [B, H, T, D] (float32); `valid`
        ([B, T] bool) keeps padding positions out; QuantError when x holds NaN or Inf."""
        a = x.detach().abs().to(torch.float32)
        if valid is not None:  # [B, T] bool: padding positions do not count
            a = torch.where(valid[:, None, :, None].to(a.device), a, 0.0)
        amax = a.amax(dim=(1, 2, 3), keepdim=True)  # [B, 1, 1, 1]
        if not bool(torch.isfinite(amax).all()):
            raise QuantError(
                f"layer {self.plan.layer} {self.plan.kind.upper()} holds NaN or Inf: a KV cache with "
                "non-finite values is a model bug"
            )
        return amax

    def set_dynamic_scales(self, amax: torch.Tensor) -> None:
        """Fix the per-sequence decode scales of both regions from amax [B, 1, 1, 1]."""
        if self.plan.fmt.needs_tensor_scale:
            self.scale = self._faulty_scale(self.plan.fmt.decode_scale_from_amax(amax))
        if self.plan.recent_fmt is not None and self.plan.recent_fmt.needs_tensor_scale:
            self.recent_scale = self._faulty_scale(self.plan.recent_fmt.decode_scale_from_amax(amax))
        self.scales_ready = True

    def init_dynamic_scales(self, x: torch.Tensor, valid: torch.Tensor | None) -> None:
        """Per-sequence decode scales from amax over heads, tokens and dims of x [B, H, T, D]."""
        self.set_dynamic_scales(self.dynamic_amax(x, valid))

    def dequantize(self, fmt: KVFormat, q: QuantizedTensor, dtype: torch.dtype) -> torch.Tensor:
        """Stored chunk q of format fmt read back (through the fault hooks) as values in `dtype`."""
        if self.plan.faults is not None:
            q = self.plan.faults.read(q)
        return fmt.dequantize(q, dtype)

    def _append_main(self, x: torch.Tensor, from_recent: bool = False) -> None:
        fmt = self.plan.fmt
        if self.exact_readback:
            q, new = quantize_dequantize(fmt, x, self.scale, self.dtype)  # type: ignore[arg-type]
            self.add_main_chunk(q, new, from_recent=from_recent)
            return
        q = fmt.quantize(x, self.scale)
        if self.plan.faults is not None:
            q = self.plan.faults.written(q, self.writes)
        new = self.dequantize(fmt, q, self.dtype)  # type: ignore[arg-type]
        self.add_main_chunk(q, new, from_recent=from_recent)

    def add_main_chunk(self, q: QuantizedTensor, new: torch.Tensor, *, from_recent: bool = False) -> None:
        """Add a quantized chunk and its dequantized values [B, H, n, D] to the main region: new tokens
        (the recent region is empty), or, `from_recent`, the oldest recent tokens re-quantized."""
        self.writes += 1
        self.main.append(q)
        if len(self.main) > CONSOLIDATE_CHUNKS:
            self.main = [cat_tokens(self.main)]
        if from_recent:
            self.shadow.overwrite(self._main_len, new)
        else:
            assert self.recent_len == 0, "new main tokens go after the recent region only when it is empty"
            self.shadow.append(new)
        self._main_len += new.shape[-2]

    def add_recent_chunk(self, q: QuantizedTensor, new: torch.Tensor) -> None:
        """Add a recent-format chunk and its dequantized values [B, H, n, D] after the newest token."""
        self.recent = q if self.recent is None else cat_tokens([self.recent, q])
        self.shadow.append(new)

    def take_oldest_recent(self, n: int) -> QuantizedTensor:
        """Remove the n oldest tokens of the recent region's bytes and return them; their shadow stays
        until `add_main_chunk(..., from_recent=True)` overwrites it."""
        assert self.recent is not None and 0 < n <= self.recent_len
        leaving = slice_tokens(self.recent, 0, n)
        self.recent = slice_tokens(self.recent, n, self.recent_len)
        self._add_trail(leaving)
        return leaving

    @property
    def keeps_trail(self) -> bool:
        """Whether main tokens keep their recent-format bytes (rollback with a recent window)."""
        return self.plan.rollback and self.plan.window > 0

    def _add_trail(self, q: QuantizedTensor) -> None:
        if self.keeps_trail:
            self.trail.append(q)
            if len(self.trail) > CONSOLIDATE_CHUNKS:
                self.trail = [cat_tokens(self.trail)]

    def trail_direct(self, x: torch.Tensor) -> None:
        """Keep the recent-format bytes of new tokens x [B, H, n, D] written straight to the main format
        (what the window holds for them when the writes end within `window` tokens of them)."""
        if self.keeps_trail:
            assert self.plan.recent_fmt is not None
            self._add_trail(self.plan.recent_fmt.quantize(x, self.recent_scale))

    def _append_recent(self, x: torch.Tensor) -> None:
        fmt = self.plan.recent_fmt
        assert fmt is not None
        if self.exact_readback:
            q, new = quantize_dequantize(fmt, x, self.recent_scale, self.dtype)  # type: ignore[arg-type]
        else:
            q = fmt.quantize(x, self.recent_scale)
            new = self.dequantize(fmt, q, self.dtype)  # type: ignore[arg-type]
        self.add_recent_chunk(q, new)

    def append(self, x: torch.Tensor) -> None:
        """Store new tokens x [B, H, n, D]; tokens pushed out of the recent window move to the main format."""
        x = x.contiguous()  # attention hands K/V as a transposed view; the quantizers prefer dense input
        self.dtype = x.dtype
        n = x.shape[-2]
        window = self.plan.window
        if window == 0:
            if n or not self.allocated:
                self._append_main(x)
            return
        move, direct = window_split(self.recent_len, n, window)
        if move:  # oldest recent tokens leave the window: re-quantize their stored values
            assert self.plan.recent_fmt is not None
            leaving = self.take_oldest_recent(move)
            self._append_main(self.dequantize(self.plan.recent_fmt, leaving, torch.float32), from_recent=True)
        if direct:  # new tokens already older than the window: straight to the main format
            self.trail_direct(x[..., :direct, :])
            self._append_main(x[..., :direct, :].contiguous())
        if n - direct or not self.allocated:
            self._append_recent(x[..., direct:, :].contiguous())

    # ---- removing tokens ----
    def _consolidate(self) -> None:
        if len(self.main) > 1:
            self.main = [cat_tokens(self.main)]
        if len(self.trail) > 1:
            self.trail = [cat_tokens(self.trail)]

    def drop_oldest(self, n: int) -> None:
        """Forget the n oldest stored tokens (sliding-window eviction)."""
        from_main = min(n, self.main_len)
        if from_main:
            self._consolidate()
            self.main = [slice_tokens(self.main[0], from_main, self.main_len)]
            if self.trail:
                self.trail = [slice_tokens(self.trail[0], from_main, self.main_len)]
        rest = n - from_main
        if rest:
            assert self.recent is not None
            self.recent = slice_tokens(self.recent, rest, self.recent_len)
        self._main_len -= from_main
        self.shadow.drop_oldest(n)

    def drop_latest(self, n: int) -> None:
        """Forget the n newest stored tokens (crop); with a trail, the tokens that are again among the
        last `window` return to the recent region in their recent-format bytes (module docstring)."""
        if self.keeps_trail and n:
            self._roll_back(len(self) - n)
            return
        from_recent = min(n, self.recent_len)
        if from_recent:
            assert self.recent is not None
            self.recent = slice_tokens(self.recent, 0, self.recent_len - from_recent)
        rest = n - from_recent
        if rest:
            self._consolidate()
            self.main = [slice_tokens(self.main[0], 0, self.main_len - rest)]
            self._main_len -= rest
        self.shadow.drop_latest(n)

    def _roll_back(self, m: int) -> None:
        """Keep the oldest m tokens as a stream whose writes ended at m holds them: main [0, m - window),
        recent (from the trail and the recent region) the rest."""
        recent_fmt = self.plan.recent_fmt
        assert recent_fmt is not None and 0 <= m <= len(self)
        self._consolidate()
        main_len = max(0, m - self.plan.window)  # <= self.main_len: the recent region holds <= window
        parts = []
        if main_len < self.main_len:
            assert self.trail and self.trail[0].shape[-2] == self.main_len, "the trail covers the main region"
            back = slice_tokens(self.trail[0], main_len, min(m, self.main_len))
            parts.append(back)
            self.shadow.overwrite(main_len, self.dequantize(recent_fmt, back, self.dtype))  # type: ignore[arg-type]
        if m > self.main_len and self.recent is not None:
            parts.append(slice_tokens(self.recent, 0, m - self.main_len))
        self.recent = cat_tokens(parts) if parts else None
        self.main = [slice_tokens(self.main[0], 0, main_len)] if main_len else []
        self.trail = [slice_tokens(self.trail[0], 0, main_len)] if main_len else []
        self._main_len = main_len
        self.shadow.drop_latest(len(self) - m)

    # ---- batch ----
    def map_batch(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Apply a batch-dim operation (select, repeat, reorder) to every stored tensor and per-row scale."""
        if self.plan.dynamic and self.scales_ready:
            self.scale = fn(self.scale) if self.scale is not None else None
            self.recent_scale = fn(self.recent_scale) if self.recent_scale is not None else None
        self.main = [map_rows(q, fn, self.scale) for q in self.main]
        self.trail = [map_rows(q, fn, self.recent_scale) for q in self.trail]
        self.recent = map_rows(self.recent, fn, self.recent_scale) if self.recent is not None else None
        self.shadow.map_batch(fn)

    # ---- rows (per-sequence prefill, batched decode) ----
    def pad_left(self, n: int) -> None:
        """Put n zero tokens before the oldest one, in the region a longer sequence would hold them in:
        the recent window first while the main region is empty, then the main region."""
        if n <= 0:
            return
        ref = self.view()
        fills_window = self.main_len == 0 and self.plan.window > 0
        to_recent = min(n, self.plan.window - self.recent_len) if fills_window else 0
        to_main = n - to_recent
        zero = ref.new_zeros((*ref.shape[:-2], 1, ref.shape[-1]))  # one zero token: tokens quantize alike
        if to_recent:
            assert self.plan.recent_fmt is not None
            q = repeat_token(self.plan.recent_fmt.quantize(zero, self.recent_scale), to_recent)
            self.recent = q if self.recent is None else cat_tokens([q, self.recent])
        if to_main:
            self.main.insert(0, repeat_token(self.plan.fmt.quantize(zero, self.scale), to_main))
            if self.keeps_trail:
                assert self.plan.recent_fmt is not None
                self.trail.insert(0, repeat_token(self.plan.recent_fmt.quantize(zero, self.recent_scale), to_main))
            self._main_len += to_main
        self.shadow.pad_left(n)

    def set_row(self, row: int, other: Stream) -> None:
        """Overwrite batch row `row` with `other`'s single sequence (same region lengths): stored bytes,
        per-sequence scales and dequantized values, nothing re-quantized."""
        if (other.main_len, other.recent_len) != (self.main_len, self.recent_len):
            raise QuantError(
                f"row regions {other.main_len}+{other.recent_len} do not match the batch's "
                f"{self.main_len}+{self.recent_len}; pad the row first"
            )
        self._consolidate()
        other._consolidate()
        if self.plan.dynamic:
            self.scale = scale_with_row(self.scale, row, other.scale)
            self.recent_scale = scale_with_row(self.recent_scale, row, other.recent_scale)
        if self.main:
            self.main[0] = set_row(self.main[0], row, other.main[0], self.scale)
        if self.trail and other.trail:
            self.trail[0] = set_row(self.trail[0], row, other.trail[0], self.recent_scale)
        if self.recent is not None and other.recent is not None:
            self.recent = set_row(self.recent, row, other.recent, self.recent_scale)
        self.shadow.set_row(row, other.shadow)

    @staticmethod
    def stack(streams: list[Stream]) -> Stream:
        """One stream holding every stream's sequences in order (same plan and region lengths)."""
        first = streams[0]
        if any((s.main_len, s.recent_len) != (first.main_len, first.recent_len) for s in streams):
            raise QuantError("streams of different lengths cannot be stacked; pad them first")
        for s in streams:
            s._consolidate()
        out = Stream(first.plan)
        out._main_len, out.dtype = first._main_len, first.dtype
        out.writes = max(s.writes for s in streams)
        out.scales_ready = all(s.scales_ready for s in streams)
        if first.plan.dynamic:
            out.scale = cat_scale_rows([s.scale for s in streams])
            out.recent_scale = cat_scale_rows([s.recent_scale for s in streams])
        if first.main:
            out.main = [stack_rows([s.main[0] for s in streams], out.scale)]
        if first.trail:
            out.trail = [stack_rows([s.trail[0] for s in streams], out.recent_scale)]
        if first.recent is not None:
            out.recent = stack_rows([s.recent for s in streams], out.recent_scale)  # type: ignore[misc]
        out.shadow = KVBuffer.stack([s.shadow for s in streams])
        return out

    # ---- inspection ----
    def stored(self) -> tuple[QuantizedTensor | None, QuantizedTensor | None]:
        """(main, recent) quantized regions as single QuantizedTensors (None when empty)."""
        self._consolidate()
        return (self.main[0] if self.main else None), self.recent

    def nbytes(self) -> int:
        """Stored bytes: codes and block scales of both regions, plus each decode scale tensor once."""
        total = sum(data_nbytes(q) for q in self.main) + (data_nbytes(self.recent) if self.recent else 0)
        for d in (self.scale if self.main else None, self.recent_scale if self.recent else None):
            if d is not None:
                total += d.numel() * d.element_size()
        return total

    def elements(self) -> int:
        """Number of stored K or V values."""
        v = self.view() if len(self) else None
        return 0 if v is None else v.numel()
