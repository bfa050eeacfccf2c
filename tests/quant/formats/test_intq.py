"""Symmetric INT8/INT4 per (token, head): hand-computed scales, round half to even, nibble packing."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quant.formats import intq
from quant.formats.minifloat import unpack_nibbles


def test_int8_hand_row() -> None:
    """amax 127 -> scale 1: codes are x rounded half to even."""
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -126.5, 3.2]])
    q = intq.quantize(x, 8)
    assert q.scales.tolist() == [[1.0]]
    assert q.codes.tolist() == [[127, 0, 2, 2, 0, -2, -126, 3]]
    assert intq.dequantize(q).tolist() == [[127.0, 0.0, 2.0, 2.0, 0.0, -2.0, -126.0, 3.0]]


def test_int4_hand_row_and_packing() -> None:
    """amax 7 -> scale 1; two's complement nibbles, element 2i in the low nibble."""
    x = torch.tensor([[-7.0, 7.0, 0.5, -2.5, 3.5, 1.0]])
    q = intq.quantize(x, 4)
    nibbles = unpack_nibbles(q.codes)[0].tolist()
    assert nibbles == [0x9, 0x7, 0x0, 0xE, 0x4, 0x1]  # -7, 7, 0, -2, 4, 1
    assert q.codes[0, 0].item() == 0x9 | (0x7 << 4)
    assert intq.dequantize(q).tolist() == [[-7.0, 7.0, 0.0, -2.0, 4.0, 1.0]]


def test_zero_row_and_per_row_scales() -> None:
    x = torch.zeros(2, 3, 8)
    x[1, 2] = torch.arange(8.0)
    q = intq.quantize(x, 8)
    assert q.scales.shape == (2, 3, 1)
    assert q.scales[0].eq(0).all() and q.scales[1, 2].item() == pytest.approx(7 / 127)
    assert torch.equal(intq.dequantize(q)[0], torch.zeros(3, 8))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-(2.0**100), 2.0**100, width=32), min_size=8, max_size=8), st.sampled_from([8, 4]))
def test_error_at_most_half_a_step(vals: list[float], bits: intq.IntBits) -> None:
    x = torch.tensor([vals])
    q = intq.quantize(x, bits)
    err = (intq.dequantize(q).double() - x.double()).abs()
    assert (err <= q.scales.double() * 0.5 * (1 + 1e-6)).all()
