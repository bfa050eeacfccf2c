"""The K/V values a cache write stores and attention reads back, for every KV format, from tensor ops alone:
safe inside a captured CUDA graph or a compiled region.

`prepare(fmt, k_scale, v_scale, device)` checks the decode scales once and builds every constant tensor on
the device (`Prepared`). After that, `stream_values` and `pair` make no host read, no host-to-device copy,
no allocation from host data, no Python branch on tensor values and raise nothing from values; they give
`registry.quantize_dequantize(fmt, x, scale, x.dtype)[1]` bit for bit for finite x, eager or compiled
(`quant.formats.compiled`: inductor's C++ on CPU, Triton on CUDA with eager's division rounding, no FMA
contraction, no flush to zero; tests/quant/formats/test_capture.py). Divisors are tensors, never Python
numbers: on CUDA inductor turns a division by a literal into a multiplication by its reciprocal.

Non-finite inputs, which the references refuse (QuantError), are written as each format's own arithmetic
takes them (the reference formulas without their finite check, MXFP4 with the OCP MX NaN scale), and
counted (`stream_values`' second result):

    format            NaN                                     +-Inf
    fp8_e4m3/e5m2     NaN                                     +-fp8_max * d (the saturating write)
    nvfp4 (4over6)    its 16-block NaN (block scale NaN)      +-6 * 448 / gs; its block at scale 448
    qa_mxfp4          its 32-block NaN (E8M0 NaN scale)       +-Inf (6 * 2**126 overflows); its block at 2**126
    qa_int8 / qa_int4 its row NaN (row scale not finite)      its row NaN
    none              NaN                                     +-Inf

`nvfp4_4over6` picks each block's scale by comparing two float64 sums of squared errors; an exact tie keeps
amax/6 as the reference does, and a difference below float64 rounding could be ordered differently by
another summation order (as between the reference on two CPU types).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from quant.errors import QuantError
from quant.formats import compiled, fp8, intq, mxfp4, nvfp4, nvfp4_fused
from quant.formats.minifloat import E8M0_BIAS, F4_E2M1_MAX, F8_E4M3_MAX
from quant.formats.registry import FP8Format, IntFormat, KVFormat, MXFP4Format, NoFormat, NVFP4Format

Family = Literal["none", "fp8", "nvfp4", "nvfp4_4over6", "mxfp4", "int"]
F32_MANTISSA_BITS = 23
E8M0_NAN = 255  # OCP MX: the E8M0 scale byte of a block holding NaN
E8M0_ZERO_VALUE = 2.0**-127  # the value of scale byte 0 (a float32 subnormal)


@dataclass(frozen=True)
class Prepared:
    """One layer's K/V rewrite, prepared once on one device: the format family, its static parameters (Python
    values a compiled graph specializes on) and K's and V's constant tensors (float32, shape () or
    broadcastable to x[..., :1])."""

    family: Family
    static: tuple[Any, ...]  # fp8: (fp8 dtype, fp8 max, truncating write); int: (bits,); others: ()
    k_const: torch.Tensor  # fp8: decode scale d; nvfp4: encode scale gs = fl32(1/d); int: qmax; else 0
    v_const: torch.Tensor

    @property
    def device(self) -> torch.device:
        """Where the constants live (and so where the rewrite runs)."""
        return self.k_const.device

    def to(self, device: torch.device | str) -> Prepared:
        """The same rewrite with its constants on `device` (once, at install)."""
        return Prepared(self.family, self.static, self.k_const.to(device), self.v_const.to(device))


def family_of(fmt: KVFormat) -> Family | None:
    """The rewrite family of a registry format; None for a format this module has no rewrite for."""
    if isinstance(fmt, NoFormat):
        return "none"
    if isinstance(fmt, NVFP4Format):
        return "nvfp4_4over6" if fmt.four_over_six else "nvfp4"
    if isinstance(fmt, FP8Format):
        return "fp8"
    if isinstance(fmt, MXFP4Format):
        return "mxfp4"
    if isinstance(fmt, IntFormat):
        return "int"
    return None


def prepare(fmt: KVFormat, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
            device: torch.device | str = "cpu") -> Prepared:
    """The rewrite of `fmt` at decode scales k_scale / v_scale (() or broadcastable to x[..., :1]; None for
    the self-scaled formats), checked here once; QuantError for a scale the format refuses, or a format
    without a rewrite here (`family_of`)."""
    family = family_of(fmt)
    if family is None:
        raise QuantError(f"format {fmt.name!r} has no capture-safe K/V rewrite")
    zero = torch.zeros((), dtype=torch.float32, device=device)
    if family in ("none", "mxfp4"):
        return Prepared(family, (), zero, zero)
    if family == "int":
        assert isinstance(fmt, IntFormat)
        qmax = torch.tensor(float(intq.qmax(fmt.bits)), dtype=torch.float32, device=device)
        return Prepared(family, (fmt.bits,), qmax, qmax)
    if k_scale is None or v_scale is None:
        raise QuantError(f"{fmt.name} needs a decode scale for K and for V")
    if family == "fp8":
        assert isinstance(fmt, FP8Format)
        static = (fp8.FP8_DTYPES[fmt.kind], fp8.FP8_MAX[fmt.kind], fmt.rounding == "toward_zero")
        k, v = (_checked_fp8(d, device) for d in (k_scale, v_scale))
        return Prepared(family, static, k, v)
    k, v = (nvfp4.global_scale_from_decode_scale(d).to(device) for d in (k_scale, v_scale))  # checks 1/d
    return Prepared(family, (), k, v)


def _checked_fp8(d: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    d = d.to(dtype=torch.float32)
    if not bool(((d > 0) & torch.isfinite(d)).all()):
        raise QuantError(f"FP8 decode scale must be positive and finite, got {d.flatten()[:4].tolist()}")
    return d.to(device)


def check_shape(p: Prepared, x: torch.Tensor, const: torch.Tensor) -> None:
    """QuantError unless x [..., D] is a floating-point tensor with a D the format's blocks divide, on the
    constants' device, over whose x[..., :1] its stream's constants `const` broadcast (shapes, not values)."""
    block = {"nvfp4": nvfp4.BLOCK_SIZE, "nvfp4_4over6": nvfp4.BLOCK_SIZE, "mxfp4": mxfp4.BLOCK_SIZE,
             "int": 2 if p.static == (4,) else 1}.get(p.family, 1)
    if not x.is_floating_point() or x.dim() == 0 or x.shape[-1] % block:
        raise QuantError(f"the {p.family} K/V rewrite needs a floating-point [..., D] tensor with D % {block} == 0, "
                         f"got {x.dtype} {tuple(x.shape)}")
    rows = (*x.shape[:-1], 1)
    if const.dim() > len(rows) or any(n not in (1, r) for n, r in zip(reversed(const.shape), reversed(rows))):
        raise QuantError(f"a {p.family} scale of shape {tuple(const.shape)} does not broadcast over x[..., :1] "
                         f"{rows}")
    if x.device != p.device:
        raise QuantError(f"K/V on {x.device}, but the rewrite was prepared on {p.device} (Prepared.to)")


def stream_values(family: Family, static: tuple[Any, ...], x: torch.Tensor,
                  const: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [..., D] quantized and read back in x's dtype, the number of non-finite elements of x as int64 ())."""
    bad = torch.isfinite(x).logical_not().sum()
    if family == "none":
        return x, bad
    if family == "fp8":
        return _fp8(x, const, *static), bad
    if family == "nvfp4":
        return _nvfp4(x, const), bad
    if family == "nvfp4_4over6":
        return _nvfp4_4over6(x, const), bad
    if family == "mxfp4":
        return _mxfp4(x), bad
    return _int(x, const), bad


def _fp8(x: torch.Tensor, d: torch.Tensor, fp8_dtype: torch.dtype, fp8_max: float, truncate: bool) -> torch.Tensor:
    """fp8.dequantize(fp8.quantize(x, d, kind, rounding), d, x.dtype)."""
    if not truncate:
        q = (x.to(torch.float32) / d).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    else:  # vLLM-CPU's write: x * fl32(1/d), the code one below where nearest rounding moved away from zero
        y = (x.to(torch.float32) * (1.0 / d)).clamp(-fp8_max, fp8_max)
        q = y.to(fp8_dtype)
        codes = q.view(torch.uint8)
        q = torch.where(q.to(torch.float32).abs() > y.abs(), codes - 1, codes).view(fp8_dtype)
    return (q.to(torch.float32) * d).to(x.dtype)


def _nvfp4(x: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    """nvfp4.dequantize(nvfp4.quantize(x, global_scale=gs), x.dtype) (the kernel recipe)."""
    _, s32, inv_gs, mag, negative, amax = nvfp4_fused.encode_blocks(x, gs)
    values = nvfp4_fused.block_values(mag, negative, s32, inv_gs)  # [..., K/16, 16] float32
    return _nan_blocks(values, amax).flatten(-2).to(x.dtype)


def _nvfp4_4over6(x: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    """nvfp4.dequantize(nvfp4.quantize_4over6(x, global_scale=gs), x.dtype): per 16-block, amax scaled to 4
    where that reconstructs it with a smaller float64 squared error, else to 6."""
    ref = x.unflatten(-1, (-1, nvfp4.BLOCK_SIZE)).to(torch.float32).to(torch.float64)  # [..., K/16, 16]
    candidates = []
    for inv_block_max in (nvfp4_fused.INV_6_F32, 0.25):
        _, s32, inv_gs, mag, negative, amax = nvfp4_fused.encode_blocks(x, gs, inv_block_max)
        deq = nvfp4_fused.block_values(mag, negative, s32, inv_gs)  # [..., K/16, 16] float32
        candidates.append((deq, (deq.to(torch.float64) - ref).square().sum(-1)))
    (deq6, err6), (deq4, err4) = candidates
    values = torch.where((err4 < err6).unsqueeze(-1), deq4, deq6)
    return _nan_blocks(values, amax).flatten(-2).to(x.dtype)


def _nan_blocks(values: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """values [..., K/16, 16] with every block whose amax [..., K/16] is NaN set to NaN (its scale would be)."""
    return torch.where(torch.isnan(amax).unsqueeze(-1), torch.nan, values)


def _mxfp4(x: torch.Tensor) -> torch.Tensor:
    """mxfp4.dequantize(mxfp4.quantize(x), x.dtype); a block holding NaN reads back NaN (E8M0 NaN scale)."""
    blocks = x.unflatten(-1, (-1, mxfp4.BLOCK_SIZE)).to(torch.float32)  # [..., K/32, 32]
    amax = blocks.abs().amax(dim=-1, keepdim=True)  # [..., K/32, 1]
    # floor(log2(amax)) is the unbiased float32 exponent field (-127 for zero and subnormals)
    exponent = (amax.view(torch.int32) >> F32_MANTISSA_BITS) - E8M0_BIAS
    biased = (exponent - mxfp4.F4_E2M1_EMAX).clamp(min=-E8M0_BIAS, max=E8M0_BIAS) + E8M0_BIAS  # 0..254
    scale = torch.where(biased == 0, E8M0_ZERO_VALUE, (biased << F32_MANTISSA_BITS).view(torch.float32))
    y = blocks / scale.clamp(min=mxfp4.F32_MIN_NORMAL)  # powers of two: exact or round-to-nearest-even
    value = _e2m1_value(nvfp4_fused.e2m1_magnitude(y.abs()))
    negative = y.view(torch.int32) < 0  # the float sign bit: -0.0 keeps code 8
    values = torch.where(negative, -value, value) * scale
    return torch.where(torch.isnan(amax), torch.nan, values).flatten(-2).to(x.dtype)


def _e2m1_value(mag: torch.Tensor) -> torch.Tensor:
    """float32 E2M1 magnitude of code m (int32 0..7): 0.5m below 4, m - 2 for 4, 5, 2m - 8 for 6, 7."""
    m = mag.to(torch.float32)
    return torch.where(m < 4, m * 0.5, torch.where(m < 6, m - 2.0, m * 2.0 - 8.0))


def _int(x: torch.Tensor, qmax: torch.Tensor) -> torch.Tensor:
    """intq.dequantize(intq.quantize(x, bits), x.dtype): per row scale amax / qmax, codes round half to even."""
    xf = x.to(torch.float32)
    scale = xf.abs().amax(dim=-1, keepdim=True) / qmax  # [..., 1]
    safe = torch.where(scale > 0, scale, 1.0)  # zero rows: 0 / 1 -> codes 0
    codes = torch.minimum(torch.maximum(torch.round(xf / safe), -qmax), qmax).to(torch.int8)  # -0.0 -> 0
    values = codes.to(torch.float32) * scale
    return torch.where(torch.isfinite(scale), values, torch.nan).to(x.dtype)


def pair_impl(family: Family, static: tuple[Any, ...], key: torch.Tensor, k_const: torch.Tensor,
              value: torch.Tensor, v_const: torch.Tensor,
              bad: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V rewritten (`stream_values` of each); their non-finite elements added to `bad` (int64 [1], in
    place) unless it is None. What `pair` runs compiled, or eagerly."""
    k, k_bad = stream_values(family, static, key, k_const)
    v, v_bad = stream_values(family, static, value, v_const)
    if bad is not None:
        bad.add_(k_bad + v_bad)
    return k, v


def one_impl(family: Family, static: tuple[Any, ...], x: torch.Tensor, const: torch.Tensor,
             bad: torch.Tensor | None) -> torch.Tensor:
    """One stream rewritten; its non-finite elements added to `bad` (int64 [1], in place) unless None."""
    values, n = stream_values(family, static, x, const)
    if bad is not None:
        bad.add_(n)
    return values


def pair(p: Prepared, key: torch.Tensor, value: torch.Tensor,
         bad: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """K [T, ...] and V [T, ...] (any shapes, dim 0 the tokens) rewritten in one call, compiled for their
    device where it can be (`quant.formats.compiled`), eagerly otherwise; non-finite elements added to `bad`."""
    check_shape(p, key, p.k_const)
    check_shape(p, value, p.v_const)
    args = (p.family, p.static, key, p.k_const, value, p.v_const, bad)
    if p.family == "none" or torch.compiler.is_compiling() or not compiled.usable():
        return pair_impl(*args)  # K and V themselves; inside a caller's graph: traced into it
    out = compiled.call(pair_impl, "K/V rewrite", p.family, p.static, compiled.rows(key), p.k_const,
                        compiled.rows(value), p.v_const, bad)
    return pair_impl(*args) if out is None else out


def one(p: Prepared, x: torch.Tensor, kind: Literal["k", "v"],
        bad: torch.Tensor | None = None) -> torch.Tensor:
    """`pair`'s rewrite of one stream, K's constants or V's."""
    const = p.k_const if kind == "k" else p.v_const
    check_shape(p, x, const)
    if p.family == "none" or torch.compiler.is_compiling() or not compiled.usable():
        return one_impl(p.family, p.static, x, const, bad)
    out = compiled.call(one_impl, "K/V rewrite", p.family, p.static, compiled.rows(x), const, bad)
    return one_impl(p.family, p.static, x, const, bad) if out is None else out


assert F4_E2M1_MAX * F8_E4M3_MAX == nvfp4.NVFP4_AMAX  # the +-Inf row of the table above: 6 * 448 / gs
