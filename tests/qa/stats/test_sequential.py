"""Group-sequential boundaries against published tables, an independent multivariate-normal check of
the recursive integration, and the anytime validity of the confidence sequence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from qa.errors import QAError
from qa.files.policy import SPENDING
from qa.stats.sequential import (
    Z_MAX,
    Design,
    adjusted_level,
    boundaries,
    boundaries_at,
    cumulative_alpha,
    exit_probabilities,
    look_sizes,
    mixture_rho,
    mixture_z,
    spent,
)

FOUR = (0.25, 0.5, 0.75, 1.0)


def test_obrien_fleming_type_matches_published_bounds():
    # Lan-DeMets O'Brien-Fleming-type spending, one-sided alpha 0.025, 4 equally spaced looks: the upper
    # bounds R gsDesign prints for gsDesign(k = 4, test.type = 1, alpha = 0.025, sfu = sfLDOF)
    # (the same as rpact getDesignGroupSequential(kMax = 4, alpha = 0.025, typeOfDesign = "asOF")).
    b = boundaries(Design(FOUR, 0.025, "obrien_fleming"))
    assert b == pytest.approx((4.3326, 2.9631, 2.3590, 2.0141), abs=6e-5)


def test_pocock_type_bounds():
    b = boundaries(Design(FOUR, 0.025, "pocock"))
    # the first bound is closed form: the alpha spent by t = 1/4 in one look
    assert b[0] == pytest.approx(stats.norm.isf(0.025 * math.log(1 + (math.e - 1) / 4)), abs=1e-8)
    # close to Pocock's constant bound for K = 4, 2.361 (Pocock 1977, Table 1; Jennison & Turnbull 2000,
    # Table 2.1, C_P(4, 0.05) two-sided = one-sided 0.025), slightly decreasing as the spending is concave
    assert all(abs(x - 2.361) < 0.015 for x in b) and list(b) == sorted(b, reverse=True)
    assert sum(exit_probabilities(FOUR, b)) == pytest.approx(0.025, abs=1e-9)


@pytest.mark.parametrize(("shape", "constant"), [
    ("pocock", 2.361),  # Jennison & Turnbull (2000) Table 2.1: C_P(4, 0.05)
    ("obrien_fleming", 2.024),  # Jennison & Turnbull (2000) Table 2.3: C_B(4, 0.05)
])
def test_recursion_reproduces_classical_constants(shape, constant):
    # the constant whose bounds c (Pocock) or c sqrt(K / k) (O'Brien-Fleming) cross with total
    # probability 0.025 under H0, solved with this module's exit probabilities: the published 3 decimals
    def bounds(c: float) -> tuple[float, ...]:
        return tuple(c if shape == "pocock" else c * math.sqrt(4 / k) for k in (1, 2, 3, 4))

    c = optimize.brentq(lambda c: sum(exit_probabilities(FOUR, bounds(c))) - 0.025, 1.5, 4.0)
    assert c == pytest.approx(constant, abs=6e-4)


def test_exit_probabilities_match_multivariate_normal():
    # independent check: P(no crossing) = P(Z_1 < b_1, ..., Z_4 < b_4), corr(Z_i, Z_j) = sqrt(t_i / t_j)
    times = (0.2, 0.45, 0.7, 1.0)  # unequal looks
    b = boundaries_at(times, 0.05, "pocock")
    t = np.array(times)
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))  # (4, 4)
    mvn = stats.multivariate_normal(mean=np.zeros(4), cov=cov, seed=0, maxpts=400_000, abseps=1e-7, releps=1e-7)
    p_none = mvn.cdf(np.array(b))
    assert sum(exit_probabilities(times, b)) == pytest.approx(1 - p_none, abs=2e-5)
    assert sum(exit_probabilities(times, b)) == pytest.approx(0.05, abs=1e-9)


def test_drift_gives_power_and_h0_spends_alpha_at_each_look():
    b = boundaries(Design(FOUR, 0.05, "obrien_fleming"))
    cum = cumulative_alpha(FOUR, b)
    assert cum == pytest.approx([spent("obrien_fleming", 0.05, t) for t in FOUR], abs=1e-9)
    # drift z_{0.95} + z_{0.8} = 2.486 at t = 1 gives a fixed-n test 80% power; OBF loses little of it
    power = sum(exit_probabilities(FOUR, b, drift=stats.norm.isf(0.05) + stats.norm.isf(0.2)))
    assert 0.77 < power < 0.80


def test_uneven_looks_use_actual_fractions():
    # the bound at an actual fraction depends on that fraction only through the spending (Lan-DeMets):
    # a first look at 0.3 instead of 0.25 spends alpha(0.3) there
    b = boundaries_at((0.3, 1.0), 0.05, "obrien_fleming")
    assert b[0] == pytest.approx(stats.norm.isf(spent("obrien_fleming", 0.05, 0.3)), abs=1e-8)
    assert sum(exit_probabilities((0.3, 1.0), b)) == pytest.approx(0.05, abs=1e-9)


def test_a_look_that_spends_nothing_is_capped_finite():
    b = boundaries_at((0.01, 1.0), 0.05, "obrien_fleming")
    assert b[0] == Z_MAX and math.isfinite(adjusted_level(b[0])) and adjusted_level(b[0]) < 1
    assert b[1] == pytest.approx(stats.norm.isf(0.05), abs=1e-6)  # nothing spent before: the fixed-n z


def test_confidence_sequence_is_the_normal_mixture_boundary():
    alpha = 0.05
    rho = mixture_rho(alpha)
    for t in (0.1, 0.5, 1.0, 3.0):
        s, v = mixture_z(t, alpha, rho) * math.sqrt(t), t
        # Howard et al. (2021), one-sided normal mixture: M(S, v) = 1 / alpha on the boundary
        m = 2 * math.sqrt(rho / (v + rho)) * math.exp(s * s / (2 * (v + rho))) * stats.norm.cdf(s / math.sqrt(v + rho))
        assert m == pytest.approx(1 / alpha, rel=1e-9)
    # rho is chosen so the boundary is tightest at t = 1
    z1 = mixture_z(1.0, alpha, rho)
    assert z1 <= mixture_z(1.0, alpha, 2 * rho) and z1 <= mixture_z(1.0, alpha, rho / 2)
    assert z1 > stats.norm.isf(alpha)  # it costs power at the planned end


def test_confidence_sequence_is_valid_at_many_looks():
    # anytime validity: even 40 looks (and beyond t = 1) cross with probability <= alpha under H0
    times = tuple(k / 40 for k in range(1, 41))
    b = boundaries_at(times, 0.05, "confidence_sequence")
    assert cumulative_alpha(times, b)[-1] < 0.05
    # while a fixed-n z at every one of 40 looks crosses far more often (the reason for spending)
    assert cumulative_alpha(times, (float(stats.norm.isf(0.05)),) * 40)[-1] > 0.2


def test_spending_functions_end_at_alpha():
    for name in ("obrien_fleming", "pocock"):
        values = [spent(name, 0.05, t) for t in (0.0, 0.1, 0.5, 0.9, 1.0)]
        assert values[0] == 0 and values[-1] == pytest.approx(0.05) and values == sorted(values)
    assert set(SPENDING) == {"obrien_fleming", "pocock", "confidence_sequence"}


def test_look_sizes():
    d = Design(FOUR, 0.05, "obrien_fleming")
    assert look_sizes(d, 1319) == (330, 660, 990, 1319)  # ceil(f * n)
    assert look_sizes(d, 4) == (1, 2, 3, 4)
    assert look_sizes(Design((0.3, 0.6, 1.0), 0.05, "pocock"), 10) == (3, 6, 10)  # 0.3 * 10 is 3, not 4
    with pytest.raises(QAError, match="cannot make 4 sequential looks"):
        look_sizes(d, 3)


@pytest.mark.parametrize(("looks", "alpha", "spending"), [
    ((0.5, 0.25, 1.0), 0.05, "pocock"), ((0.5, 0.9), 0.05, "pocock"), ((0.0, 1.0), 0.05, "pocock"),
    ((), 0.05, "pocock"), (FOUR, 0.6, "pocock"), (FOUR, 0.05, "obrien"),
])
def test_design_refuses_bad_input(looks, alpha, spending):
    with pytest.raises(ValueError):
        Design(looks, alpha, spending)
