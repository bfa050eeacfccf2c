"""FP8 KV quantization: equal to torch's saturating cast of x / d; hand values at the range ends."""

from __future__ import annotations

import pytest
import torch

from quant.errors import QuantError
from quant.formats import fp8


@pytest.mark.parametrize(("kind", "dtype", "top"), [("e4m3", torch.float8_e4m3fn, 448.0), ("e5m2", torch.float8_e5m2, 57344.0)])
def test_equals_torch_saturating_cast(kind: fp8.FP8Kind, dtype: torch.dtype, top: float) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, 64, generator=g) * torch.logspace(-4, 6, 64)
    d = torch.tensor(0.37)
    q = fp8.quantize(x, d, kind)
    assert q.dtype == dtype
    ref = (x / d).clamp(-top, top).to(dtype)
    assert torch.equal(q.view(torch.uint8), ref.view(torch.uint8))
    assert torch.equal(fp8.dequantize(q, d), ref.float() * d)


@pytest.mark.parametrize(
    ("kind", "x", "want"),
    [
        ("e4m3", 1e9, 448.0), ("e4m3", -500.0, -448.0), ("e4m3", 17.0, 16.0), ("e4m3", 2.0**-10, 0.0),
        ("e4m3", 3 * 2.0**-10, 2.0**-8),
        ("e5m2", 1e9, 57344.0), ("e5m2", -61440.0, -57344.0), ("e5m2", 2.0**-17, 0.0), ("e5m2", 1.125, 1.0),
    ],
)
def test_hand_values(kind: fp8.FP8Kind, x: float, want: float) -> None:
    one = torch.tensor(1.0)
    assert fp8.dequantize(fp8.quantize(torch.tensor([x]), one, kind), one).item() == want


def test_bad_scale_rejected() -> None:
    with pytest.raises(QuantError, match="positive and finite"):
        fp8.quantize(torch.ones(4), torch.tensor(0.0), "e4m3")
