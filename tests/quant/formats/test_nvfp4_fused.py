"""The torch.compile'd NVFP4 path agrees bit for bit with the pure reference (and so with the vectors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quant.errors import QuantError
from quant.formats import compiled, nvfp4, nvfp4_fused
from quant.formats.registry import get_format, quantize_dequantize
from tests.quant.formats.test_nvfp4 import VECTORS


def _assert_same(x: torch.Tensor, **scale: object) -> None:
    ref = nvfp4.quantize(x, **scale)  # type: ignore[arg-type]
    got = nvfp4_fused.quantize(x, **scale)  # type: ignore[arg-type]
    assert torch.equal(got.packed, ref.packed)
    assert torch.equal(got.scales, ref.scales)
    assert torch.equal(got.global_scale, ref.global_scale)
    assert torch.equal(nvfp4_fused.dequantize(got).view(torch.int32), nvfp4.dequantize(ref).view(torch.int32))


def test_fused_matches_reference_on_the_oracle_vectors() -> None:
    if not VECTORS.is_file():
        pytest.skip(f"NVFP4 oracle vectors not found at {VECTORS} (set QA_SHARED_DIR)")
    with np.load(VECTORS) as z:
        cases = sorted({k.split("__")[0] for k in z.files if not k.startswith("__")} - {"special_inf_nan_2x32"})
        for case in cases:
            x = torch.from_numpy(z[f"{case}__x"])
            d = float(z[f"{case}__static_decode_scale"])
            if np.isnan(d):
                _assert_same(x)
            else:
                _assert_same(x, decode_scale=d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_matches_reference_on_random_kv(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, 40, 128, generator=g) * torch.exp(3 * torch.randn(3, 8, 40, 1, generator=g))
    x[0, 0, 0, :16] = 0.0  # all-zero block
    x[0, 0, 1, :16] = 1e-30  # underflowing block
    x = x.to(dtype)
    _assert_same(x)
    _assert_same(x, decode_scale=torch.rand(1, 8, 1, 1, generator=g) * 0.05 + 1e-4)  # per head
    _assert_same(x[:, :, :7], global_scale=384.0)  # another row count, same compiled kernel


def test_fused_format_and_errors() -> None:
    fmt = get_format("nvfp4", fused=True)
    x = torch.randn(2, 8, 64)
    q = fmt.quantize(x)
    assert torch.equal(fmt.dequantize(q), get_format("nvfp4").dequantize(get_format("nvfp4").quantize(x)))
    x[1, 2, 3] = float("inf")
    with pytest.raises(QuantError, match="NaN or Inf"):
        nvfp4_fused.quantize(x)


@pytest.mark.parametrize(("dtype", "out"), [(torch.float32, None), (torch.bfloat16, None),
                                            (torch.float32, torch.bfloat16)])
def test_roundtrip_matches_eager_quantize_then_dequantize(dtype: torch.dtype, out: torch.dtype | None) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 8, 17, 64, generator=g) * torch.exp(3 * torch.randn(2, 3, 8, 17, 1, generator=g))
    x[0, 0, 0, 0, :16] = 0.0  # all-zero block
    x[0, 0, 0, 1, :16] = -1e-30  # underflowing block of negatives: codes 8 (-0) in the kernel recipe
    x[1, 2, 3, 4, :8] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0]) * 6 / 5.0  # ties after scaling
    x = x.to(dtype)
    for d in (torch.tensor(0.003), torch.rand(2, 3, 1, 1, 1, generator=g) * 0.05 + 1e-4):
        both = nvfp4_fused.roundtrip(x, d, out)
        assert both is not None
        t, values = both
        ref = nvfp4.quantize(x, decode_scale=d)
        assert torch.equal(t.packed, ref.packed) and torch.equal(t.scales, ref.scales)
        expect = nvfp4.dequantize(ref, out or dtype)
        assert values.dtype == expect.dtype and values.shape == x.shape
        bits = torch.int16 if expect.dtype == torch.bfloat16 else torch.int32
        assert torch.equal(values.view(bits), expect.view(bits))  # -0.0 and +0.0 kept apart


def test_a_process_compiles_after_its_warm_up_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "_eager_writes", [0])
    monkeypatch.setenv(compiled.WARMUP_ENV, "3")
    x = torch.randn(4, 32)
    assert [compiled.enabled(x) for _ in range(5)] == [False, False, False, True, True]
    assert not compiled.enabled(torch.randn(1, 32)) and compiled._eager_writes == [3]  # one row: not counted
    monkeypatch.setattr(compiled, "_eager_writes", [0])
    monkeypatch.delenv(compiled.WARMUP_ENV)
    assert compiled.warmup() == compiled.DEFAULT_WARMUP == 4096
    monkeypatch.setenv(compiled.WARMUP_ENV, "many")
    with pytest.raises(QuantError, match="QA_KV_COMPILE_AFTER='many': give a whole number of writes"):
        compiled.enabled(x)


def test_roundtrip_errors_switch_and_fallback(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    x = torch.randn(4, 32)
    x[1, 3] = float("nan")
    with pytest.raises(QuantError, match="NaN or Inf"):
        nvfp4_fused.roundtrip(x, 0.01)
    monkeypatch.setenv(compiled.WARMUP_ENV, "0")  # compiled from the first write
    assert compiled.enabled(torch.randn(4, 32))
    assert not compiled.enabled(torch.randn(1, 32))  # one row: eager (no 0/1 specialization)
    monkeypatch.setenv(compiled.ENV, "0")
    assert not compiled.enabled(torch.randn(4, 32))
    monkeypatch.delenv(compiled.ENV)

    def broken(fn):
        def call(*args, **kwargs):
            raise RuntimeError("no C++ compiler\nsecond line")
        return call

    monkeypatch.setattr(compiled, "compiled", broken)
    monkeypatch.setattr(compiled, "_failed", [])
    fmt = get_format("nvfp4")
    y = torch.randn(3, 4, 64)
    with caplog.at_level("WARNING"):
        q, values = quantize_dequantize(fmt, y, torch.tensor(0.002), torch.float32)
    assert "(RuntimeError: no C++ compiler); quantizing eagerly" in caplog.text
    assert "second line" not in caplog.text
    assert not compiled.enabled(y)  # off for the rest of the process
    ref = fmt.quantize(y, torch.tensor(0.002))
    assert torch.equal(q.data["packed"], ref.data["packed"]) and torch.equal(values, fmt.dequantize(ref))
