"""NVFP4 quantizer: bit-exact against the shared oracle vectors, E2M1/E4M3 value tables, properties."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from quant.errors import QuantError
from quant.formats import nvfp4
from quant.formats.minifloat import (
    E2M1_VALUES,
    SMALL_ENCODE_NUMEL,
    e2m1_decode,
    e2m1_encode,
    e4m3_from_bytes,
    e4m3_round,
    e4m3_to_bytes,
    pack_nibbles,
    unpack_nibbles,
)

REPO = Path(__file__).resolve().parents[3]
VECTORS = Path(os.environ.get("QA_SHARED_DIR", REPO.parent / "shared")) / "vectors" / "nvfp4" / "vectors.npz"
INFORMATIONAL_CASES = {"special_inf_nan_2x32"}  # each library does its own thing with NaN/Inf


def _load_vectors() -> dict[str, np.ndarray]:
    if not VECTORS.is_file():
        pytest.skip(f"NVFP4 oracle vectors not found at {VECTORS} (set QA_SHARED_DIR to the shared folder)")
    with np.load(VECTORS) as z:
        return {k: z[k] for k in z.files}


def _cases() -> list[str]:
    if not VECTORS.is_file():
        return ["<vectors missing>"]
    with np.load(VECTORS) as z:
        names = {k.split("__")[0] for k in z.files if not k.startswith("__")}
    return sorted(names - INFORMATIONAL_CASES)


def _quantize_case(v: dict[str, np.ndarray], case: str, recipe: nvfp4.Recipe) -> nvfp4.NVFP4Tensor:
    x = torch.from_numpy(v[f"{case}__x"])
    d = float(v[f"{case}__static_decode_scale"])
    if np.isnan(d):
        return nvfp4.quantize(x, recipe=recipe)
    return nvfp4.quantize(x, decode_scale=d, recipe=recipe)


def _assert_bits_equal(got: torch.Tensor, want: np.ndarray, what: str) -> None:
    want_t = torch.from_numpy(np.ascontiguousarray(want))
    assert got.shape == want_t.shape, what
    if got.dtype == torch.float32:
        got, want_t = got.view(torch.int32), want_t.view(torch.int32)  # bit-for-bit, -0.0 != 0.0
    bad = (got != want_t).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.shape[0]} mismatches, first at {bad[0].tolist()}"


# --- oracle vectors ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", _cases())
def test_kernel_recipe_matches_flashinfer_bit_for_bit(case: str) -> None:
    v = _load_vectors()
    q = _quantize_case(v, case, "kernel")
    assert q.global_scale.item() == float(v[f"{case}__fi__global_scale"])
    _assert_bits_equal(q.packed, v[f"{case}__fi__packed"], f"{case} packed")
    _assert_bits_equal(q.scales, v[f"{case}__fi__scale_e4m3"], f"{case} scale bytes")
    _assert_bits_equal(e4m3_from_bytes(q.scales), v[f"{case}__fi__scale_f32"], f"{case} scale f32")
    _assert_bits_equal(nvfp4.dequantize(q), v[f"{case}__fi__dequant"], f"{case} dequant")


@pytest.mark.parametrize("case", _cases())
def test_compressed_tensors_recipe_matches_ct_bit_for_bit(case: str) -> None:
    v = _load_vectors()
    q = _quantize_case(v, case, "compressed_tensors")
    assert q.global_scale.item() == float(v[f"{case}__ct__global_scale"])
    _assert_bits_equal(unpack_nibbles(q.packed), unpack_nibbles(torch.from_numpy(v[f"{case}__ct__packed"])), case)
    _assert_bits_equal(q.scales, v[f"{case}__ct__scale_e4m3"], f"{case} scale bytes")
    _assert_bits_equal(nvfp4.dequantize(q), v[f"{case}__ct__dequant"], f"{case} dequant")


@pytest.mark.parametrize("case", _cases())
def test_kernel_codes_match_ct_except_ties_and_zero_sign(case: str) -> None:
    """The documented kernel-vs-ct differences are the only ones: one E2M1 tie and the sign of zero."""
    v = _load_vectors()
    q = _quantize_case(v, case, "kernel")
    ours = unpack_nibbles(q.packed) & 0x7
    theirs = unpack_nibbles(torch.from_numpy(v[f"{case}__ct__packed"])) & 0x7
    n_diff = int((ours != theirs).sum())
    assert n_diff == (1 if case == "static_calib_3x8x128" else 0)


def test_documented_ao_mo_tie_differences() -> None:
    """The module docstring's counts of code differences against torchao/ModelOpt on E2M1 ties."""
    v = _load_vectors()
    expected = {"adv_disagree": (63, 63), "gs384_2x64": (24, 24), "kv_3x8x128": (2, 1), "rand_4x64": (0, 0)}
    for case, (n_ao, n_mo) in expected.items():
        ours = unpack_nibbles(_quantize_case(v, case, "kernel").packed) & 0x7
        got = tuple(
            int((ours != (unpack_nibbles(torch.from_numpy(v[f"{case}__{impl}__packed"])) & 0x7)).sum())
            for impl in ("ao", "mo")
        )
        assert got == (n_ao, n_mo), case


def test_special_inf_nan_case_raises() -> None:
    v = _load_vectors()
    with pytest.raises(QuantError, match="NaN or Inf"):
        nvfp4.quantize(torch.from_numpy(v["special_inf_nan_2x32__x"]), decode_scale=1.0)


# --- value tables --------------------------------------------------------------------------------


def test_e2m1_value_table_all_16_codes() -> None:
    expected = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    got = e2m1_decode(torch.arange(16, dtype=torch.uint8))
    assert got.tolist() == expected
    assert torch.signbit(got[8])  # code 8 is -0.0
    assert list(E2M1_VALUES) == expected
    # every representable value encodes to its own code (-0.0 -> code 0: the sign test is x < 0)
    codes = e2m1_encode(torch.tensor(expected))
    assert codes.tolist() == list(range(8)) + [0] + list(range(9, 16))


@pytest.mark.parametrize(
    ("x", "code"),
    [
        (0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6),  # ties to even
        (0.2500001, 1), (0.7499999, 1), (4.9999995, 6), (5.0000005, 7),  # one ulp either side
        (6.5, 7), (1e30, 7), (-1e30, 15), (-5.0, 14), (-0.25, 8), (-1e-30, 8), (-0.0, 0), (1e-45, 0),
    ],
)
def test_e2m1_rounding_table(x: float, code: int) -> None:
    assert e2m1_encode(torch.tensor([x], dtype=torch.float32)).item() == code


def test_e2m1_small_and_large_encoders_agree() -> None:
    """The bucketize path (small tensors) and the compare-count path (large ones) give the same codes."""
    g = torch.Generator().manual_seed(5)
    points = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    near = torch.cat([points, torch.nextafter(points, torch.zeros(7)), torch.nextafter(points, torch.full((7,), 9.0))])
    tail = torch.tensor([0.0, -0.0, 7.0, -1e30])
    y = torch.cat([near, -near, torch.randn(SMALL_ENCODE_NUMEL, generator=g) * 3, tail])
    assert y.numel() >= SMALL_ENCODE_NUMEL > 1000
    large = e2m1_encode(y)
    small = torch.cat([e2m1_encode(chunk) for chunk in y.split(1000)])
    assert torch.equal(large, small)
    for flag in (True, False):
        assert torch.equal(e2m1_encode(y, sign_from_bit=flag)[-4:], e2m1_encode(tail, sign_from_bit=flag))


@pytest.mark.parametrize(
    ("x", "byte"),
    [
        (2.0**-9, 0x01),  # smallest subnormal
        (2.0**-10, 0x00),  # half the smallest subnormal: tie to even -> 0 (the kernel's underflow)
        (1.0000001 * 2.0**-10, 0x01),  # just above the tie rounds up
        (3 * 2.0**-10, 0x02),  # tie between subnormals 1 and 2 -> even 2
        (7 * 2.0**-9, 0x07),  # largest subnormal
        (2.0**-6, 0x08),  # smallest normal
        (1.0, 0x38),
        (17.0, 0x58),  # tie between 16 (0x58) and 18 (0x59) -> even 16
        (19.0, 0x5A),  # tie between 18 (0x59) and 20 (0x5A) -> even 20
        (448.0, 0x7E),  # largest finite
        (464.0, 0x7E),  # would round to 480 (the NaN code) without saturation
        (1e6, 0x7E),
        (0.0, 0x00),
    ],
)
def test_e4m3_scale_rounding_table(x: float, byte: int) -> None:
    s = e4m3_round(torch.tensor([x], dtype=torch.float32))
    assert e4m3_to_bytes(s).item() == byte
    assert e4m3_from_bytes(torch.tensor([byte], dtype=torch.uint8)).item() == s.item()


def test_hand_computed_block() -> None:
    """gs = 1, amax 6 -> SF = 6 * fl32(1/6) = 1 -> s = 1.0 (0x38): codes are E2M1 of x itself."""
    x = torch.tensor([[6.0, -0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -6.0, 0.0, 0.5, -1.0, 3.0, 4.0, -2.0, 1.5]])
    q = nvfp4.quantize(x, global_scale=1.0)
    assert q.scales.tolist() == [[0x38]]
    codes = unpack_nibbles(q.packed)[0].tolist()
    assert codes == [7, 8, 2, 2, 4, 4, 6, 6, 15, 0, 1, 10, 5, 6, 12, 3]
    assert q.packed[0, 0].item() == 7 | (8 << 4)  # element 0 low nibble, element 1 high nibble
    expected = [6.0, -0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -6.0, 0.0, 0.5, -1.0, 3.0, 4.0, -2.0, 1.5]
    assert nvfp4.dequantize(q)[0].tolist() == expected


def test_underflowed_and_zero_blocks_are_all_zero() -> None:
    x = torch.zeros(2, 16)
    x[1] = -(2.0**-12)  # SF = 2**-12 / 6 < 2**-10: underflows E4M3
    q = nvfp4.quantize(x, global_scale=1.0)
    assert q.scales.tolist() == [[0], [0]]
    assert q.packed.eq(0).all()
    assert nvfp4.dequantize(q).eq(0).all()


def test_saturation_at_the_range_ends() -> None:
    """gs = 1: a block of amax 2688 * 4 saturates both the scale (448) and the codes (+-6)."""
    x = torch.tensor([[10752.0, -10752.0, 2688.0, -3000.0] + [0.0] * 12])
    q = nvfp4.quantize(x, global_scale=1.0)
    assert q.scales.item() == 0x7E
    assert unpack_nibbles(q.packed)[0, :4].tolist() == [7, 15, 7, 15]
    assert nvfp4.dequantize(q)[0, :4].tolist() == [2688.0, -2688.0, 2688.0, -2688.0]


def test_per_head_scale_equals_per_head_slices() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 32, generator=g) * torch.tensor([0.1, 1.0, 30.0]).view(1, 3, 1, 1)
    d = torch.tensor([0.1, 1.0, 30.0]).view(1, 3, 1, 1) * 4 / 2688
    q = nvfp4.quantize(x, decode_scale=d)
    deq = nvfp4.dequantize(q)
    for h in range(3):
        qh = nvfp4.quantize(x[:, h], decode_scale=float(d[0, h, 0, 0]))
        assert torch.equal(q.packed[:, h], qh.packed)
        assert torch.equal(q.scales[:, h], qh.scales)
        assert torch.equal(deq[:, h], nvfp4.dequantize(qh))


@pytest.mark.parametrize("shape", [(4, 64), (64, 8, 128)])  # small and large encoder paths
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_input_dtypes_equal_their_fp32_values(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    for recipe in nvfp4.RECIPES:
        a, b = nvfp4.quantize(x, recipe=recipe), nvfp4.quantize(x.float(), recipe=recipe)  # type: ignore[arg-type]
        assert torch.equal(a.packed, b.packed) and torch.equal(a.scales, b.scales)
        assert torch.equal(a.global_scale, b.global_scale)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_raises(bad: float) -> None:
    x = torch.ones(2, 32)
    x[1, 17] = bad
    with pytest.raises(QuantError, match="NaN or Inf"):
        nvfp4.quantize(x)


def test_argument_errors() -> None:
    x = torch.ones(2, 32)
    with pytest.raises(QuantError, match="not both"):
        nvfp4.quantize(x, decode_scale=1.0, global_scale=1.0)
    with pytest.raises(QuantError, match="multiple of 16"):
        nvfp4.quantize(torch.ones(2, 24))
    with pytest.raises(QuantError, match="positive"):
        nvfp4.quantize(x, decode_scale=0.0)
    with pytest.raises(QuantError, match="recipe"):
        nvfp4.quantize(x, recipe="magic")  # type: ignore[arg-type]
    with pytest.raises(QuantError, match="floating-point"):
        nvfp4.quantize(torch.ones(2, 32, dtype=torch.int32))


def test_dynamic_scale_of_all_zero_tensor_is_one() -> None:
    q = nvfp4.quantize(torch.zeros(1, 16))
    assert q.global_scale.item() == 1.0 and q.packed.eq(0).all()


# --- 4over6 --------------------------------------------------------------------------------------


def _block_sse(x: torch.Tensor, q: nvfp4.NVFP4Tensor) -> torch.Tensor:
    err = (nvfp4.dequantize(q).double() - x.double()).square()
    return err.reshape(*x.shape[:-1], -1, 16).sum(-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_4over6_error_never_above_either_fixed_choice(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 128, generator=g) * torch.exp(torch.randn(16, 128, generator=g))  # heavy tails
    adaptive = _block_sse(x, nvfp4.quantize_4over6(x))
    six = _block_sse(x, nvfp4.quantize_4over6(x, block_max=6))
    four = _block_sse(x, nvfp4.quantize_4over6(x, block_max=4))
    assert (adaptive <= six).all() and (adaptive <= four).all()
    assert (adaptive < six).any() and (four < six).any()  # both choices really occur
    # block_max=6 is plain NVFP4
    assert torch.equal(nvfp4.quantize_4over6(x, block_max=6).packed, nvfp4.quantize(x).packed)


def test_4over6_hand_block() -> None:
    """A block of +-{4, 2, 1}: amax/4 represents it exactly (s = 1), amax/6 (s = 0.6875) does not."""
    x = torch.tensor([[4.0, -2.0, 1.0, 2.0] * 4])
    q = nvfp4.quantize_4over6(x, global_scale=1.0)
    assert q.scales.item() == 0x38  # 1.0
    assert torch.equal(nvfp4.dequantize(q), x)
    assert not torch.equal(nvfp4.dequantize(nvfp4.quantize(x, global_scale=1.0)), x)


# --- properties ----------------------------------------------------------------------------------

finite_f32 = st.floats(allow_nan=False, allow_infinity=False, width=32)


@st.composite
def nvfp4_inputs(draw: st.DrawFn) -> torch.Tensor:
    rows = draw(st.integers(1, 3))
    blocks = draw(st.integers(1, 3))
    exp = draw(st.integers(-40, 40))
    vals = draw(st.lists(finite_f32, min_size=rows * blocks * 16, max_size=rows * blocks * 16))
    x = torch.tensor(vals, dtype=torch.float32).reshape(rows, blocks * 16)
    return x if draw(st.booleans()) else (x / x.abs().amax().clamp(min=1e-30)) * 2.0**exp


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 15), min_size=2, max_size=64).filter(lambda c: len(c) % 2 == 0))
def test_packing_round_trips(codes: list[int]) -> None:
    c = torch.tensor(codes, dtype=torch.uint8)
    packed = pack_nibbles(c)
    assert packed.shape == (len(codes) // 2,)
    assert torch.equal(unpack_nibbles(packed), c)


@settings(max_examples=60, deadline=None)
@given(nvfp4_inputs(), st.sampled_from([None, 2.0**-20, 1.0, 1000.0]))
def test_requantizing_the_dequantized_tensor_is_identity(x: torch.Tensor, gs: float | None) -> None:
    """quantize(dequantize(q)) == q for every block whose scale is 0 or a normal E4M3 number.

    A normal scale is within 2**-4 of SF, so the block maximum always lands on code 7 (6.0) and the
    dequantized block reproduces SF; a subnormal scale can be far from SF (see the next test).
    """
    q = nvfp4.quantize(x) if gs is None else nvfp4.quantize(x, global_scale=gs)
    deq = nvfp4.dequantize(q)
    assert torch.isfinite(deq).all()  # never NaN/Inf for finite input
    q2 = nvfp4.quantize(deq, global_scale=q.global_scale)
    s = e4m3_from_bytes(q.scales)
    keep = (s == 0) | (s >= 2.0**-6)  # [..., K/16]
    assert torch.equal(q2.scales[keep], q.scales[keep])
    # a negative value that rounded to zero (code 8) dequantizes to -0.0, which encodes as code 0
    codes = unpack_nibbles(q.packed)
    canonical = torch.where(codes == 8, 0, codes).reshape(*codes.shape[:-1], -1, 16)
    codes2 = unpack_nibbles(q2.packed).reshape(canonical.shape)
    assert torch.equal(codes2[keep], canonical[keep])


def test_requantizing_is_not_idempotent_for_a_subnormal_scale() -> None:
    """SF = 1.5 * 2**-9 rounds (tie, even) to s = 2**-8: the block maximum becomes code 6 (4.0), not 7."""
    x = torch.tensor([[6 * 1.5 * 2.0**-9] + [0.0] * 15])
    q = nvfp4.quantize(x, global_scale=1.0)
    assert q.scales.item() == 0x02 and unpack_nibbles(q.packed)[0, 0].item() == 6
    q2 = nvfp4.quantize(nvfp4.dequantize(q), global_scale=1.0)
    assert q2.scales.item() == 0x01  # SF' = 4 * 2**-8 / 6 = 1.33 * 2**-9 -> 2**-9


@settings(max_examples=60, deadline=None)
@given(nvfp4_inputs())
def test_dequantized_error_is_bounded_by_half_a_step(x: torch.Tensor) -> None:
    """Each element is within half the largest E2M1 step (1 * s/gs) of x, or saturated at 6 s/gs where a
    subnormal block scale rounded down; underflowed blocks are tiny.

    Holds below amax 2688 * 2**114 ~ 5.6e37, where the dynamic gs stops at its floor and values saturate.
    """
    assume(float(x.abs().max()) < 2.0**120)
    q = nvfp4.quantize(x)
    deq = nvfp4.dequantize(q).double()
    s = e4m3_from_bytes(q.scales).double()
    # an underflowed block has SF <= 2**-10, i.e. amax <= 6 * 2**-10 / gs
    bound = torch.where(s == 0, 6 * 2.0**-10, s) / q.global_scale.double()
    bound = bound.repeat_interleave(16, dim=-1)
    # a subnormal E4M3 scale can round down by far more than the 1/16 of a normal one (2.86e-3 -> 2**-9),
    # so the block maximum saturates at code 6: its error is then |x| - 6 s/gs (under s/gs for normal s)
    top = 6 * s.repeat_interleave(16, dim=-1) / q.global_scale.double()
    bound = torch.maximum(bound, x.abs().double() - top)
    # the half-step bound is exact; x and the dequantized value are float32, so allow one float32 ulp of each
    ulps = 2 * torch.finfo(torch.float32).eps * torch.maximum(x.abs().double(), deq.abs())
    assert ((deq - x.double()).abs() <= bound * (1 + 1e-6) + ulps).all()


# --- live oracles ----------------------------------------------------------------------------------


def test_compressed_tensors_recipe_matches_live_compressed_tensors() -> None:
    """Random KV-shaped data through compressed-tensors' own NVFP4 qparams/quantize/dequantize."""
    fwd = pytest.importorskip("compressed_tensors.quantization.lifecycle.forward")
    scheme = pytest.importorskip("compressed_tensors.quantization.quant_scheme")
    utils = pytest.importorskip("compressed_tensors.quantization.utils")
    args = scheme.NVFP4["weights"]
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(96, 128, generator=g) * torch.exp(2 * torch.randn(96, 1, generator=g))).to(torch.bfloat16)
    xf = x.float()
    amax = xf.abs().amax().reshape(1)
    gs = utils.generate_gparam(-amax, amax)
    groups = xf.reshape(96, 8, 16)  # [rows, K/16, 16]
    scale, zp = utils.calculate_qparams(groups.amin(-1), groups.amax(-1), args, global_scale=gs)
    ref = fwd.dequantize(fwd.quantize(xf, scale, zp, args, global_scale=gs), scale, zp, args, global_scale=gs,
                         dtype=torch.float32)
    q = nvfp4.quantize(x, global_scale=gs.reshape(()), recipe="compressed_tensors")
    assert q.global_scale.item() == nvfp4.dynamic_global_scale(x).item() == gs.item()
    assert torch.equal(e4m3_from_bytes(q.scales), scale)
    assert torch.equal(nvfp4.dequantize(q).view(torch.int32), ref.view(torch.int32))


@pytest.mark.gpu
def test_cuda_matches_cpu_bit_for_bit() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 8, 33, 128, generator=g) * torch.exp(3 * torch.randn(4, 8, 33, 1, generator=g))
    d = torch.rand(1, 8, 1, 1, generator=g) * 0.01 + 1e-4
    for kwargs in ({}, {"decode_scale": d}):
        cpu = nvfp4.quantize(x, **kwargs)  # type: ignore[arg-type]
        gpu = nvfp4.quantize(x.cuda(), **{k: v.cuda() for k, v in kwargs.items()})  # type: ignore[arg-type]
        assert torch.equal(gpu.packed.cpu(), cpu.packed) and torch.equal(gpu.scales.cpu(), cpu.scales)
        assert torch.equal(nvfp4.dequantize(gpu).cpu().view(torch.int32), nvfp4.dequantize(cpu).view(torch.int32))


def test_a_subnormal_block_scale_that_rounds_down_saturates_the_block_maximum() -> None:
    """The case hypothesis found: block 2's amax 6.3937e-6 under gs = 2688 (tensor amax 1.0) needs SF = 2.86e-3,
    which rounds (nearest) to 2**-9 = 1.95e-3; x / (s/gs) = 8.8 > 6, so the element decodes to 6 s/gs."""
    x = torch.zeros(1, 32)
    x[0, 15], x[0, 31] = 1.0, 6.3937e-6
    q = nvfp4.quantize(x)
    assert float(q.global_scale) == pytest.approx(2688.0)
    assert q.scales[0, 1].item() == 0x01  # E4M3 code 1: 2**-9
    assert float(nvfp4.dequantize(q)[0, 31]) == pytest.approx(6 * 2.0**-9 / 2688.0, rel=1e-6)
