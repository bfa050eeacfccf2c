"""A growable [B, H, T, D] buffer of cached K or V: appends write into spare capacity, reads are views.

Both KV caches keep what attention reads in one: the plain cache its K and V, the emulated quantized
cache the dequantized values of what it stores. transformers' DynamicCache concatenates the whole
history at every decode step (O(T) copies per token); here the capacity doubles when full, so copies
are amortized O(1) per token, and evicting the oldest tokens only moves a start offset.

The row operations (`pad_left`, `set_row`, `stack`) let an engine prefill sequences one at a time and
batch them for decoding: rows are right-aligned, a shorter row is left-padded with zeros (its
attention mask hides them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


class KVBuffer:
    """Tokens [B, H, length, D], oldest first, in a buffer with spare capacity along the token dim."""

    MIN_CAPACITY = 64

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None  # [B, H, capacity, D]
        self.start = 0
        self.length = 0

    def tensor(self) -> torch.Tensor | None:
        """The stored tokens [B, H, length, D] (a view of the buffer), or None before the first write."""
        return None if self.buf is None else self.buf[..., self.start : self.start + self.length, :]

    def append(self, x: torch.Tensor) -> None:
        """Store x [B, H, n, D] after the current tokens."""
        n = x.shape[-2]
        end = self.start + self.length
        if self.buf is None or end + n > self.buf.shape[-2]:
            live = self.tensor()
            capacity = max(2 * (self.length + n), self.MIN_CAPACITY)
            buf = x.new_empty((*x.shape[:-2], capacity, x.shape[-1]))
            if live is not None and self.length:
                buf[..., : self.length, :] = live
            self.buf, self.start, end = buf, 0, self.length
        self.buf[..., end : end + n, :] = x
        self.length += n

    def overwrite(self, position: int, x: torch.Tensor) -> None:
        """Replace the n stored tokens from `position` (0 = oldest) by x [B, H, n, D]."""
        assert self.buf is not None and position + x.shape[-2] <= self.length
        first = self.start + position
        self.buf[..., first : first + x.shape[-2], :] = x

    def drop_oldest(self, n: int) -> None:
        """Forget the n oldest tokens."""
        self.start += n
        self.length -= n

    def drop_latest(self, n: int) -> None:
        """Forget the n newest tokens."""
        self.length -= n

    def map_batch(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Apply a batch-dim operation (select, repeat, reorder) to the stored tokens."""
        live = self.tensor()
        if live is not None:
            self.buf, self.start = fn(live).contiguous(), 0

    # -- rows ------------------------------------------------------------------------------------

    def pad_left(self, n: int) -> None:
        """Put n zero tokens before the oldest one (every row)."""
        live = self.tensor()
        if n <= 0 or live is None:
            return
        if self.start >= n:  # room before the live tokens
            self.start -= n
            self.buf[..., self.start : self.start + n, :] = 0  # type: ignore[index]
            self.length += n
            return
        buf = live.new_zeros((*live.shape[:-2], max(2 * (self.length + n), self.MIN_CAPACITY), live.shape[-1]))
        buf[..., n : n + self.length, :] = live
        self.buf, self.start = buf, 0
        self.length += n

    def set_row(self, row: int, other: KVBuffer) -> None:
        """Overwrite batch row `row` with `other`'s single row (same length)."""
        mine, theirs = self.tensor(), other.tensor()
        assert mine is not None and theirs is not None and theirs.shape[0] == 1
        assert theirs.shape[1:] == mine.shape[1:], f"row shape {tuple(theirs.shape)} vs batch {tuple(mine.shape)}"
        mine[row] = theirs[0]

    @classmethod
    def stack(cls, rows: Sequence[KVBuffer]) -> KVBuffer:
        """One buffer holding the rows of every buffer in `rows` (same length), in order."""
        parts = [r.tensor() for r in rows]
        assert all(p is not None for p in parts)
        live = torch.cat(parts, dim=0)  # type: ignore[arg-type]
        out = cls()
        out.buf = live.new_empty((*live.shape[:-2], max(2 * live.shape[-2], cls.MIN_CAPACITY), live.shape[-1]))
        out.buf[..., : live.shape[-2], :] = live
        out.length = live.shape[-2]
        return out
