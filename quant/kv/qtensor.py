"""QuantizedTensor helpers for a KV cache: slices and concatenation along the token dim, row (batch dim)
replacement and stacking, and the per-sequence decode scales that travel with the rows.

Stored tensors are [B, H, T, ...] (codes [B, H, T, D / codes-per-byte], block scales [B, H, T, D / block]);
a decode scale is () (one per layer), [1, H, 1, 1] (per head) or [B, 1|H, 1, 1] (per sequence).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from quant.formats.registry import QuantizedTensor


def cat_tokens(chunks: list[QuantizedTensor]) -> QuantizedTensor:
    """Same-format, same-scale chunks [B, H, T_i, ...] concatenated along the token dim (-2 of each)."""
    if len(chunks) == 1:
        return chunks[0]
    first = chunks[0]
    data = {key: torch.cat([c.data[key] for c in chunks], dim=-2) for key in first.data}
    tokens = sum(c.shape[-2] for c in chunks)
    return replace(first, shape=(*first.shape[:-2], tokens, first.shape[-1]), data=data)


def slice_tokens(q: QuantizedTensor, start: int, stop: int) -> QuantizedTensor:
    """Tokens start:stop of q [B, H, T, ...] (views)."""
    data = {key: t[..., start:stop, :] for key, t in q.data.items()}
    return replace(q, shape=(*q.shape[:-2], stop - start, q.shape[-1]), data=data)


def repeat_token(q: QuantizedTensor, n: int) -> QuantizedTensor:
    """A one-token QuantizedTensor [B, H, 1, ...] repeated to n tokens."""
    data = {key: t.expand(*t.shape[:-2], n, t.shape[-1]).contiguous() for key, t in q.data.items()}
    return replace(q, shape=(*q.shape[:-2], n, q.shape[-1]), data=data)


def data_nbytes(q: QuantizedTensor) -> int:
    """Bytes of the stored tensors (codes and block scales), without the decode scale."""
    return sum(t.numel() * t.element_size() for t in q.data.values())


def set_row(q: QuantizedTensor, row: int, other: QuantizedTensor,
            scale: torch.Tensor | None) -> QuantizedTensor:
    """q with sequence `row` of every stored tensor replaced (in place) by other's sequence 0, and `scale`."""
    for key, t in q.data.items():
        t[row] = other.data[key][0]
    return replace(q, scale=scale if q.scale is not None else None)


def stack_rows(qs: list[QuantizedTensor], scale: torch.Tensor | None) -> QuantizedTensor:
    """Same-format QuantizedTensors [B_i, H, T, ...] concatenated along the batch dim, with `scale`."""
    first = qs[0]
    data = {key: torch.cat([q.data[key] for q in qs], dim=0) for key in first.data}
    batch = sum(q.shape[0] for q in qs)
    return replace(first, shape=(batch, *first.shape[1:]), data=data,
                   scale=scale if first.scale is not None else None)


def scale_as_4d(d: torch.Tensor) -> torch.Tensor:
    """A decode scale () or [B|1, H|1, 1, 1] as 4-D."""
    return d.reshape(1, 1, 1, 1) if d.dim() == 0 else d


def scale_with_row(scale: torch.Tensor | None, row: int, other: torch.Tensor | None) -> torch.Tensor | None:
    """A per-sequence scale [B, ...] with row `row` replaced by `other`'s [1, ...] (a copy)."""
    if scale is None or other is None or scale.dim() == 0:
        return scale
    out = scale.clone()
    out[row] = other[0]
    return out


def cat_scale_rows(scales: list[torch.Tensor | None]) -> torch.Tensor | None:
    """Per-sequence scales [1, ...] of several streams as one [B, ...] tensor."""
    if scales[0] is None or scales[0].dim() == 0:
        return scales[0]
    return torch.cat(scales, dim=0)  # type: ignore[arg-type]


def map_rows(q: QuantizedTensor, fn: Callable[[torch.Tensor], torch.Tensor],
             scale: torch.Tensor | None) -> QuantizedTensor:
    """q with a batch-dim operation (select, repeat, reorder) applied to every stored tensor, and `scale`."""
    data = {key: fn(t) for key, t in q.data.items()}
    first = next(iter(data.values()))
    return replace(q, data=data, scale=scale if q.scale is not None else None,
                   shape=(first.shape[0], *q.shape[1:]))
