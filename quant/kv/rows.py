"""Operations both KV caches (plain and emulated) offer the same way, so both arms batch alike.

- `BatchOpsMixin` (layers): transformers' batch-dim operations (prefix reuse, dropping finished rows,
  beams) over the layer's `_map_batch(fn)`.
- `RowOpsMixin` (caches): the row operations that right-align sequences prefilled one by one into a
  decode batch (`pad_left`, `drop_oldest`, `set_row`) over the cache's `_rows()`: its layers, once every
  one of them supports row operations (full attention), else a QuantError before any layer changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from quant.errors import QuantError
from quant.kv.shape import ROWS_NEED_FULL_ATTENTION


class RowLayer(Protocol):
    """A cache layer with row operations."""

    def pad_left(self, n: int) -> None: ...

    def drop_oldest(self, n: int) -> None: ...

    def set_row(self, row: int, other: Any) -> None: ...


class BatchOpsMixin:
    """transformers' batch-dim cache-layer operations for a layer whose `_map_batch(fn)` applies a
    batch-dim tensor function to everything it stores (prefix reuse, dropping finished rows, beams)."""

    def _map_batch(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        raise NotImplementedError

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every sequence `repeats` times (stored values copied as they are)."""
        self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the sequences `indices`."""
        self._map_batch(lambda t: t[indices.to(t.device)])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder sequences (beam search)."""
        self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))


class RowOpsMixin:
    """Row operations of a whole cache, applied to every layer `_rows()` returns."""

    layers: Sequence[Any]

    @property
    def supports_rows(self) -> bool:
        """Whether `pad_left`, `set_row`, `drop_oldest` and `stack` work (every layer full attention)."""
        raise NotImplementedError

    def _rows(self) -> Sequence[RowLayer]:
        """Every layer, once the cache supports row operations; else QuantError before any layer changes."""
        if not self.supports_rows:
            raise QuantError(ROWS_NEED_FULL_ATTENTION)
        return self.layers

    def pad_left(self, n: int) -> None:
        """Put n zero tokens before every sequence (right-aligning it with a longer batch)."""
        for layer in self._rows():
            layer.pad_left(n)

    def drop_oldest(self, n: int) -> None:
        """Forget the n oldest positions of every sequence (padding for all of them)."""
        for layer in self._rows():
            layer.drop_oldest(n)

    def set_row(self, row: int, other: RowOpsMixin) -> None:
        """Overwrite sequence `row` with `other`'s single sequence of the same length (pad it first)."""
        for mine, theirs in zip(self._rows(), other._rows(), strict=True):
            mine.set_row(row, theirs)
