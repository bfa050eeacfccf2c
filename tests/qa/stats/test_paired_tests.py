"""qa.stats.paired_tests: McNemar on items and Tango's score interval."""

from __future__ import annotations

import math

import pytest
from scipy import optimize, stats
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar

from qa.stats.paired_tests import mcnemar, tango_constrained_p21, tango_interval, tango_statistic


def test_mcnemar_hand_computed_and_statsmodels() -> None:
    m = mcnemar(7, 1)  # X ~ Bin(8, 1/2): P(X <= 1) = 9/256
    assert m.p_exact == pytest.approx(18 / 256)
    assert m.p_midp == pytest.approx(18 / 256 - 8 / 256)
    assert m.p_exact == pytest.approx(sm_mcnemar([[5, 7], [1, 9]], exact=True).pvalue)
    m = mcnemar(2, 1)  # exact 1 (capped), mid-p 1 - P(X = 2) = 1 - 3/8
    assert (m.p_exact, m.p_midp) == pytest.approx((1.0, 0.625))
    assert (mcnemar(4, 4).p_exact, mcnemar(4, 4).p_midp) == (1.0, 1.0)
    assert mcnemar(0, 0).p_exact == 1.0


def test_tango_published_example() -> None:
    # Bentur et al. (2009) paired 2x2 [[1, 1], [7, 12]], the worked example of Fagerland, Lydersen &
    # Laake (2014) and of contingencytables::Tango_asymptotic_score_CI_paired_2x2: -0.517 to -0.026.
    iv = tango_interval(n01=1, n10=7, n=21, conf=0.95)
    assert (iv.lower, iv.upper) == pytest.approx((-0.517, -0.026), abs=6e-4)


@pytest.mark.parametrize(("n12", "n21", "n", "d0"), [(3, 9, 50, -0.05), (0, 4, 30, 0.02), (5, 1, 40, 0.1)])
def test_tango_constrained_mle_matches_numeric_optimum(n12: int, n21: int, n: int, d0: float) -> None:
    # Multinomial likelihood with p12 = p21 + d0: maximise over p21 (p11 + p22 = 1 - 2 p21 - d0).
    n_conc = n - n12 - n21

    def nll(p21: float) -> float:
        p12 = p21 + d0
        rest = 1 - p12 - p21
        return -(n12 * math.log(max(p12, 1e-300)) + n21 * math.log(max(p21, 1e-300))
                 + n_conc * math.log(max(rest, 1e-300)))

    lo, hi = max(0.0, -d0) + 1e-12, (1 - d0) / 2 - 1e-12
    ref = optimize.minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12}).x
    assert tango_constrained_p21(n12, n21, n, d0) == pytest.approx(ref, abs=1e-6)


def test_tango_statistic_at_zero_is_mcnemar_z() -> None:
    assert tango_statistic(3, 11, 100, 0.0) == pytest.approx((3 - 11) / math.sqrt(14))


def test_tango_interval_endpoints_and_zero_discordant_closed_form() -> None:
    z = stats.norm.ppf(0.95)
    iv = tango_interval(n01=2, n10=9, n=120, conf=0.90)
    assert tango_statistic(2, 9, 120, iv.lower) == pytest.approx(z, abs=1e-7)
    assert tango_statistic(2, 9, 120, iv.upper) == pytest.approx(-z, abs=1e-7)
    # No discordant pairs: T(d) = -sqrt(n d / (1 - d)) for d > 0, so the limit is z^2 / (n + z^2).
    iv0 = tango_interval(0, 0, 100, 0.90)
    assert iv0.upper == pytest.approx(z**2 / (100 + z**2), abs=1e-8)
    assert iv0.lower == pytest.approx(-iv0.upper, abs=1e-8)
    assert tango_interval(0, 10, 10, 0.95).lower == -1.0
