"""The K/V scale conventions on hand-computed numbers: what each stores, how a compressed-tensors scheme
declares one (as calculate_qparams defines it), which one numbers fit, what refuses them, and the one-line
warnings (all 1.0; off by 448 or 6)."""

from __future__ import annotations

import pytest

from quant.errors import QuantError
from quant.scales.conventions import (
    CONVENTIONS,
    FIT_FACTOR,
    convention_problems,
    convention_warnings,
    expected_convention,
    fit_convention,
    get_convention,
    mismatch_factor,
    scheme_convention,
)

AMAX = [2.0, 8.0, 0.5, 12.0]  # per layer (K then V, say)


def test_each_convention_stores_and_decodes_as_written() -> None:
    assert CONVENTIONS["nvfp4-decode"].stored_from_amax(2688.0) == 1.0
    assert CONVENTIONS["nvfp4-global"].stored_from_amax(6.0) == 1.0
    assert CONVENTIONS["fp8-decode"].stored_from_amax(448.0) == 1.0
    gs = CONVENTIONS["nvfp4-encode"].stored_from_amax(2.0)
    assert gs == 1344.0 and CONVENTIONS["nvfp4-encode"].decode_scale(gs) == 2.0 / 2688
    assert CONVENTIONS["nvfp4-global"].decode_scale(0.25) == 0.25  # vLLM uses a k_scale as it is
    # the factors between conventions: 448 (amax/6 vs amax/2688), 6 (amax/448 vs amax/2688), 1 (encode)
    decode = CONVENTIONS["nvfp4-decode"]
    assert mismatch_factor(CONVENTIONS["nvfp4-global"], decode) == 448.0
    assert mismatch_factor(CONVENTIONS["fp8-decode"], decode) == 6.0
    assert mismatch_factor(decode, CONVENTIONS["fp8-decode"]) == 1 / 6
    assert mismatch_factor(CONVENTIONS["nvfp4-encode"], decode) == 1.0
    assert expected_convention("nvfp4") is decode and expected_convention("fp8").name == "fp8-decode"
    assert expected_convention("fp8_e5m2") is None
    with pytest.raises(QuantError, match="did you mean 'nvfp4-decode'"):
        get_convention("nvfp4_decode")


@pytest.mark.parametrize("name", ["nvfp4-decode", "nvfp4-global", "fp8-decode"])
def test_fit_finds_the_convention_even_with_other_calibration_data(name: str) -> None:
    conv = CONVENTIONS[name]
    # another tool's amax: up to 2x off per layer (other data, a percentile observer)
    stored = [conv.stored_from_amax(a * f) for a, f in zip(AMAX, [1.0, 0.5, 1.9, 0.8], strict=True)]
    fit = fit_convention(stored, AMAX)
    assert fit.convention == name
    assert fit.ratio == pytest.approx(0.9)  # the median of the factors: (0.8 + 1.0) / 2
    assert set(fit.ratios) == {"nvfp4-decode", "nvfp4-global", "fp8-decode"}


def test_fit_of_encode_fields_and_of_numbers_that_fit_nothing() -> None:
    gs = [2688.0 / a for a in AMAX]
    assert fit_convention(gs, AMAX, reciprocal=True).convention == "nvfp4-encode"
    # amax/448 and amax/2688 are 6x apart: sqrt(6) either way covers the line between them; amax / 60 lies
    # 7.5x from amax/448 and 10x from amax/6: no convention
    fit = fit_convention([a / 60 for a in AMAX], AMAX)
    assert fit.convention is None and fit.ratio == pytest.approx(448 / 60) and fit.ratio > FIT_FACTOR
    with pytest.raises(QuantError, match="cannot fit 1 stored scales against 2"):
        fit_convention([1.0], [1.0, 2.0])


def test_a_compressed_tensors_scheme_declares_what_calculate_qparams_stores() -> None:
    # amax / (range / 2): FP8_E4M3 [-448, 448] -> amax/448, FP4_E2M1 [-6, 6] -> amax/6, per tensor or per head
    fp8 = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True}
    assert scheme_convention(fp8) == "fp8-decode"
    assert scheme_convention({**fp8, "strategy": "attn_head"}) == "fp8-decode"
    assert scheme_convention({**fp8, "num_bits": 4}) == "nvfp4-global"
    with pytest.raises(QuantError, match="strategy=tensor_group: not a per-layer"):
        scheme_convention({**fp8, "num_bits": 4, "strategy": "tensor_group", "group_size": 16})
    with pytest.raises(QuantError, match="type=int, strategy=tensor: no per-layer K/V scale convention"):
        scheme_convention({**fp8, "type": "int"})
    with pytest.raises(QuantError, match="asymmetric"):
        scheme_convention({**fp8, "symmetric": False})


def test_problems_refuse_ones_and_numbers_that_fit_another_convention() -> None:
    decode, glob, fp8 = CONVENTIONS["nvfp4-decode"], CONVENTIONS["nvfp4-global"], CONVENTIONS["fp8-decode"]
    assert convention_problems([1.0] * 4, None, fp8) == [
        "every K/V scale is 1.0: uncalibrated (vLLM's default), not measured on data"]
    stored = [a / 6 for a in AMAX]
    assert convention_problems(stored, fit_convention(stored, AMAX), glob) == []  # declared as it fits
    assert convention_problems(stored, None, decode) == []  # no fit: nothing to disagree with
    [line] = convention_problems(stored, fit_convention(stored, AMAX), decode)
    assert line == "declared nvfp4-decode (amax / 2688) but the numbers fit nvfp4-global (amax / 6): off by 448x"
    [line] = convention_problems([a / 2688 for a in AMAX], fit_convention([a / 2688 for a in AMAX], AMAX), fp8)
    assert line.endswith("but the numbers fit nvfp4-decode (amax / 2688): off by 6x")
    [line] = convention_problems([a / 60 for a in AMAX], fit_convention([a / 60 for a in AMAX], AMAX), fp8)
    assert "fit no known convention (closest fp8-decode, off by 7.47x)" in line


def test_warnings_are_one_line_each() -> None:
    decode, glob = CONVENTIONS["nvfp4-decode"], CONVENTIONS["nvfp4-global"]
    ones = convention_warnings("DIR", [1.0] * 4, None, decode, decode)
    assert ones == ["warning: DIR: every K/V scale is 1.0: uncalibrated (vLLM's default), not measured on data"]
    stored = [a / 6 for a in AMAX]  # amax/6 declared as NVFP4 decode scales, read as they are
    lines = convention_warnings("DIR", stored, fit_convention(stored, AMAX), decode, decode)
    assert len(lines) == 2 and all("\n" not in line and line.startswith("warning: DIR: ") for line in lines)
    assert "declared nvfp4-decode (amax / 2688) but the numbers fit nvfp4-global (amax / 6): off by 448x" in lines[0]
    assert "off by the factor 448 between conventions (too large)" in lines[1]
    fp8 = [a / 448 for a in AMAX]  # FP8 scales read as they are by an NVFP4 cache: 6x too large
    [line] = convention_warnings("DIR", fp8, fit_convention(fp8, AMAX), CONVENTIONS["fp8-decode"], decode)
    assert "off by the factor 6 between conventions (too large)" in line
    right = [a / 2688 for a in AMAX]
    assert convention_warnings("DIR", right, fit_convention(right, AMAX), decode, decode) == []
    assert convention_warnings("DIR", stored, None, glob, decode)[0].endswith("(too large)")
    assert convention_warnings("DIR", stored, None, glob, None) == []  # a reader that converts: nothing to say
