"""KVBuffer: in-place appends, views, eviction offsets, and the row operations (pad, set, stack)."""

from __future__ import annotations

import torch

from quant.kv.buffer import KVBuffer


def _x(b: int, n: int, start: float = 0.0) -> torch.Tensor:
    return (torch.arange(b * 2 * n * 4, dtype=torch.float32) + start).reshape(b, 2, n, 4)


def test_appends_equal_concatenation_and_capacity_doubles() -> None:
    buf, parts = KVBuffer(), []
    for i, n in enumerate([5, 1, 1, 70, 1, 3]):
        part = _x(2, n, start=100.0 * i)
        buf.append(part)
        parts.append(part)
        assert torch.equal(buf.tensor(), torch.cat(parts, dim=-2))
    assert buf.length == 81
    assert buf.buf.shape[-2] >= 81 and buf.buf.shape[-2] <= 2 * (81 + 3)


def test_drop_oldest_moves_the_start_and_later_appends_keep_order() -> None:
    buf = KVBuffer()
    buf.append(_x(1, 10))
    buf.drop_oldest(4)
    buf.append(_x(1, 100, start=1000.0))  # forces a reallocation: only the live tokens are copied
    expected = torch.cat([_x(1, 10)[..., 4:, :], _x(1, 100, start=1000.0)], dim=-2)
    assert torch.equal(buf.tensor(), expected)
    assert buf.start == 0


def test_pad_left_prepends_zeros_with_and_without_room_before_the_start() -> None:
    buf = KVBuffer()
    buf.append(_x(1, 6, start=1.0))
    buf.pad_left(3)  # no room: new buffer
    assert torch.equal(buf.tensor(), torch.cat([torch.zeros(1, 2, 3, 4), _x(1, 6, start=1.0)], dim=-2))
    buf.drop_oldest(5)  # room for 5 before the start now
    live = buf.tensor().clone()
    buf.buf[..., : buf.start, :] = 7.0  # stale values there must be zeroed by pad_left
    buf.pad_left(2)
    assert buf.start == 3
    assert torch.equal(buf.tensor(), torch.cat([torch.zeros(1, 2, 2, 4), live], dim=-2))


def test_stack_and_set_row() -> None:
    a, b, c = KVBuffer(), KVBuffer(), KVBuffer()
    a.append(_x(1, 5, start=0.0))
    b.append(_x(1, 5, start=500.0))
    c.append(_x(1, 5, start=900.0))
    both = KVBuffer.stack([a, b])
    assert torch.equal(both.tensor(), torch.cat([a.tensor(), b.tensor()], dim=0))
    both.append(_x(2, 1, start=-50.0))  # appends after stacking still work
    c.append(_x(1, 1, start=-70.0))
    both.set_row(0, c)
    assert torch.equal(both.tensor()[0], c.tensor()[0])
    assert torch.equal(both.tensor()[1, :, :5], b.tensor()[0])
