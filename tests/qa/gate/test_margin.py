"""qa.gate.margin.interval_status: the one decision of an interval against a margin, on hand-placed intervals."""

from __future__ import annotations

import math

import pytest

from qa.files.comparison import Interval
from qa.gate.margin import interval_status

M = 0.05


@pytest.mark.parametrize(("lower", "upper", "want"), [
    (-0.04, 0.10, "pass"),  # wholly above -margin
    (-0.20, -0.06, "fail"),  # wholly below it
    (-0.08, 0.01, "inconclusive"),  # straddles it
    (-0.05, 0.01, "inconclusive"),  # touching the limit is not beyond it (strict)
    (-0.30, -0.05, "inconclusive"),
])
def test_above_is_noninferiority(lower: float, upper: float, want: str) -> None:
    assert interval_status(Interval(lower=lower, upper=upper), above=-M) == want


@pytest.mark.parametrize(("lower", "upper", "want"), [
    (-0.01, 0.04, "pass"),
    (0.06, 0.09, "fail"),
    (0.01, 0.07, "inconclusive"),
    (0.02, 0.05, "inconclusive"),
])
def test_below_is_a_change_that_must_stay_small(lower: float, upper: float, want: str) -> None:
    assert interval_status(Interval(lower=lower, upper=upper), below=M) == want


@pytest.mark.parametrize(("lower", "upper", "want"), [
    (-0.04, 0.04, "pass"),  # inside (-margin, +margin)
    (-0.09, -0.06, "fail"),  # wholly below -margin
    (0.06, 0.09, "fail"),  # wholly above +margin
    (-0.06, 0.04, "inconclusive"),  # over the lower edge
    (-0.04, 0.06, "inconclusive"),  # over the upper edge
    (-0.10, 0.10, "inconclusive"),  # over both
])
def test_both_limits_are_tost(lower: float, upper: float, want: str) -> None:
    assert interval_status(Interval(lower=lower, upper=upper), above=-M, below=M) == want


def test_a_nan_limit_decides_nothing() -> None:
    ci = Interval(lower=0.0, upper=0.01)
    assert interval_status(ci, above=math.nan) == "inconclusive"
    assert interval_status(ci, below=math.nan) == "inconclusive"


def test_no_limit_is_an_internal_error() -> None:
    with pytest.raises(ValueError, match="needs a limit"):
        interval_status(Interval(lower=0.0, upper=0.01))
