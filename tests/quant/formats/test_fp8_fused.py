"""The compiled FP8 KV-cache write gives the eager path's bytes and values."""

from __future__ import annotations

import pytest
import torch

from quant.errors import QuantError
from quant.formats import fp8, fp8_fused
from quant.formats.registry import get_format, quantize_dequantize


@pytest.mark.parametrize("kind", ["e4m3", "e5m2"])
@pytest.mark.parametrize(("dtype", "out"), [(torch.float32, None), (torch.bfloat16, None),
                                            (torch.float32, torch.bfloat16)])
def test_roundtrip_matches_eager_quantize_then_dequantize(kind, dtype: torch.dtype, out) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 5, 11, 64, generator=g) * torch.exp(4 * torch.randn(2, 3, 5, 11, 1, generator=g))
    x[0, 0, 0, 0, :4] = torch.tensor([0.0, -0.0, 1e-30, -1e-30])
    x = x.to(dtype)
    for d in (torch.tensor(0.01), torch.rand(2, 3, 1, 1, 1, generator=g) * 0.02 + 1e-4):  # saturates some
        both = fp8_fused.roundtrip(x, d, kind, out)
        assert both is not None
        q, values = both
        ref = fp8.quantize(x, d, kind)
        assert torch.equal(q.view(torch.uint8), ref.view(torch.uint8))
        expect = fp8.dequantize(ref, d, out or dtype)
        bits = torch.int16 if expect.dtype == torch.bfloat16 else torch.int32
        assert values.dtype == expect.dtype and torch.equal(values.view(bits), expect.view(bits))


def test_roundtrip_errors_and_the_format_path() -> None:
    x = torch.randn(4, 32)
    with pytest.raises(QuantError, match="positive and finite"):
        fp8_fused.roundtrip(x, torch.tensor(0.0), "e4m3")
    x[2, 5] = float("inf")
    with pytest.raises(QuantError, match="NaN or Inf"):
        fp8_fused.roundtrip(x, torch.tensor(0.1), "e4m3")
    fmt = get_format("fp8_e4m3")
    y = torch.randn(3, 2, 7, 64)
    q, values = quantize_dequantize(fmt, y, None, torch.float32)  # dynamic scale
    ref = fmt.quantize(y, None)
    assert torch.equal(q.scale, ref.scale)
    assert torch.equal(q.data["values"].view(torch.uint8), ref.data["values"].view(torch.uint8))
    assert torch.equal(values, fmt.dequantize(ref))
