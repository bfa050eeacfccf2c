"""Group-sequential boundaries for a one-sided test at several looks: numbers only, no decisions.

Z_k is the standardized statistic at look k, information fraction t_k (paired items n_k / n_planned).
Under H0 Z_k = W(t_k) / sqrt(t_k) for a standard Brownian motion W (with drift theta: mean theta sqrt(t_k)).
A design stops at the first look with Z_k >= b_k; `boundaries` gives the one-sided b_k.

Spending (Lan & DeMets 1983, "Discrete sequential boundaries for clinical trials", Biometrika 70, 659):
the cumulative one-sided alpha spent by fraction t is
- "obrien_fleming": alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)) (O'Brien-Fleming type);
- "pocock": alpha(t) = alpha ln(1 + (e - 1) t) (Pocock type).
b_k solves P(Z_1 < b_1, ..., Z_{k-1} < b_{k-1}, Z_k >= b_k) = alpha(t_k) - alpha(t_{k-1}), found by the
recursive numerical integration of Armitage, McPherson & Rowe (1969) as in Jennison & Turnbull (2000),
"Group Sequential Methods with Applications to Clinical Trials", ch. 19: the sub-density of Z_k on the
continuation region is carried look to look on a Simpson grid. Using the actual fractions at each look
(not the planned ones) keeps the level right for uneven blocks (the point of spending functions).

"confidence_sequence": an anytime-valid boundary instead of spending: the one-sided normal-mixture
boundary of Howard, Ramdas, McAuliffe & Sekhon (2021), "Time-uniform, nonparametric, nonasymptotic
confidence sequences", Ann. Statist. 49(2), section 3 (normal mixture, one-sided: a half-normal mixing
distribution of precision rho). With intrinsic time v = t (planned information = 1) and S = Z sqrt(v),
M(S, v) = 2 sqrt(rho / (v + rho)) exp(S^2 / (2 (v + rho))) Phi(S / sqrt(v + rho)) is a nonnegative
supermartingale, so P(exists v: M >= 1 / alpha) <= alpha (Ville) at any number and timing of looks; the
boundary is the S solving M = 1 / alpha, and rho is chosen to make it tightest at t = 1. It costs
power at the planned end (a larger final z than spending) for the freedom to look at any time.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

from qa.errors import QAError
from qa.files.policy import SPENDING

# A one-sided critical z above this spends < 1e-15: treated as "no stopping here" (an OBF look at a
# tiny fraction). Capping keeps every level and interval finite (JSON has no inf).
Z_MAX = 8.0
STEP = 0.04  # Simpson grid step on the z scale, at most 1/8 of the next look's transition sd
TAIL = 10.0  # the grid spans the mean +/- TAIL sd of Z_k: mass beyond is below 1e-23


@dataclass(frozen=True)
class Design:
    """A group-sequential design: looks (information fractions, increasing, last = 1.0), one-sided
    alpha, and the spending function (one of SPENDING)."""

    looks: tuple[float, ...]
    alpha: float
    spending: str

    def __post_init__(self) -> None:
        check_times(self.looks)
        if self.looks[-1] != 1.0:
            raise ValueError(f"the last look must be at fraction 1.0 (got {self.looks[-1]})")
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5) (got {self.alpha})")
        if self.spending not in SPENDING:
            raise ValueError(f"unknown spending {self.spending!r} (one of {', '.join(SPENDING)})")


def check_times(times: tuple[float, ...] | list[float]) -> None:
    """ValueError unless `times` is non-empty and strictly increasing in (0, 1]."""
    if not times:
        raise ValueError("list at least one look")
    prev = 0.0
    for t in times:
        if not prev < t <= 1.0:
            raise ValueError(f"looks must be strictly increasing in (0, 1] (got {list(times)})")
        prev = t


def spent(spending: str, alpha: float, t: float) -> float:
    """Cumulative one-sided alpha spent by information fraction t in [0, 1] (Lan-DeMets)."""
    if t <= 0:
        return 0.0
    t = min(t, 1.0)
    if spending == "obrien_fleming":
        return float(2 * special.ndtr(-special.ndtri(1 - alpha / 2) / math.sqrt(t)))
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    raise ValueError(f"{spending!r} has no spending function (one of obrien_fleming, pocock)")


def _sf(x: np.ndarray | float) -> np.ndarray:
    """1 - Phi(x), vectorised (scipy.special.ndtr without the scipy.stats overhead)."""
    return special.ndtr(-np.asarray(x, dtype=np.float64))


def _simpson(lo: float, hi: float, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Grid (m,) on [lo, hi], m odd with spacing <= step, and its composite Simpson weights (m,)."""
    m = 2 * max(2, math.ceil((hi - lo) / (2 * step))) + 1
    z = np.linspace(lo, hi, m)
    w = np.ones(m)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return z, w * (hi - lo) / (3 * (m - 1))


class _Recursion:
    """The sub-density of Z_k on the continuation region, carried look to look (J&T ch. 19)."""

    def __init__(self, times: tuple[float, ...], drift: float) -> None:
        self.times, self.drift, self.k = times, drift, 0
        self.z: np.ndarray | None = None  # (m,) grid of the previous look's continuation region
        self.mass: np.ndarray | None = None  # (m,) sub-density times Simpson weight on it

    def _shift(self) -> tuple[np.ndarray, float, float]:
        """(mean of sqrt(t_k) Z_k given each previous grid point, sd of the increment, sqrt(t_k))."""
        t, t_prev = self.times[self.k], self.times[self.k - 1]
        dt = t - t_prev
        assert self.z is not None and dt > 0
        return self.z * math.sqrt(t_prev) + self.drift * dt, math.sqrt(dt), math.sqrt(t)

    def cross(self, b: float) -> float:
        """P(continue to the current look and Z_k >= b)."""
        if self.z is None:
            return float(_sf(b - self.drift * math.sqrt(self.times[0])))
        mean, sd, rt = self._shift()
        return float(self.mass @ _sf((b * rt - mean) / sd))

    def advance(self, b: float) -> None:
        """Restrict the current look to Z_k < b and carry the sub-density to it; then move to the next look."""
        t = self.times[self.k]
        if self.k + 1 < len(self.times):  # resolve the next transition's kernel: sd sqrt(dt_next / t) on z_k
            centre = self.drift * math.sqrt(t)
            lo, hi = centre - TAIL, min(b, centre + TAIL)
            step = min(STEP, math.sqrt((self.times[self.k + 1] - t) / t) / 8)
            if hi <= lo:  # nothing continues: every path has crossed
                y, w, dens = np.array([lo, lo]), np.zeros(2), np.zeros(2)
            else:
                y, w = _simpson(lo, hi, step)
                if self.z is None:
                    dens = np.exp(-0.5 * (y - centre) ** 2) / math.sqrt(2 * math.pi)
                else:
                    mean, sd, rt = self._shift()
                    # (m_y, m_z) transition density of Z_k = y given Z_{k-1} = z, times the previous mass
                    u = (y[:, None] * rt - mean[None, :]) / sd
                    dens = (np.exp(-0.5 * u * u) @ self.mass) * rt / (sd * math.sqrt(2 * math.pi))
            self.z, self.mass = y, dens * w
        self.k += 1


def exit_probabilities(times: tuple[float, ...], bounds: tuple[float, ...], drift: float = 0.0) -> tuple[float, ...]:
    """P(first Z_k >= b_k at look k), per look, when Z_k has mean drift * sqrt(t_k) (drift: the expected
    z at t = 1; 0 is H0)."""
    check_times(times)
    rec, out = _Recursion(tuple(times), drift), []
    for b in bounds:
        out.append(rec.cross(b))
        rec.advance(b)
    return tuple(out)


def _solve(rec: _Recursion, target: float) -> float:
    """The b with rec.cross(b) = target, at most Z_MAX."""
    if target <= 0 or rec.cross(Z_MAX) >= target:
        return Z_MAX
    return float(optimize.brentq(lambda b: rec.cross(b) - target, -TAIL, Z_MAX, xtol=1e-10, rtol=1e-12))


def spending_boundaries(times: tuple[float, ...], alpha: float, spending: str) -> tuple[float, ...]:
    """One-sided b_k at the actual fractions `times` (increasing in (0, 1]); the last time should be 1.0
    to spend all of alpha."""
    check_times(times)
    rec, out, prev = _Recursion(tuple(times), 0.0), [], 0.0
    for t in times:
        cum = spent(spending, alpha, t)
        b = _solve(rec, cum - prev)
        out.append(b)
        rec.advance(b)
        prev = cum
    return tuple(out)


def _mixture_x(alpha: float, ratio: float) -> float:
    """x = S / sqrt(v + rho) solving log 2 + log(ratio) / 2 + x^2 / 2 + log Phi(x) = log(1 / alpha),
    ratio = rho / (v + rho); the left side increases in x (x + phi / Phi > 0)."""
    target = math.log(1 / alpha) - math.log(2) - 0.5 * math.log(ratio)

    def f(x: float) -> float:
        return x * x / 2 + float(stats.norm.logcdf(x)) - target

    hi = 1.0
    while f(hi) < 0:
        hi *= 2
    return float(optimize.brentq(f, -50.0, hi, xtol=1e-12))


def mixture_z(t: float, alpha: float, rho: float) -> float:
    """One-sided normal-mixture boundary (Howard et al. 2021) on the z scale at fraction t > 0."""
    return min(Z_MAX, _mixture_x(alpha, rho / (t + rho)) * math.sqrt((t + rho) / t))


@functools.lru_cache(maxsize=32)
def mixture_rho(alpha: float) -> float:
    """The mixing precision rho (units of the planned information) whose boundary is tightest at t = 1."""
    res = optimize.minimize_scalar(lambda lr: mixture_z(1.0, alpha, math.exp(lr)), bounds=(-8.0, 4.0),
                                   method="bounded", options={"xatol": 1e-8})
    return float(math.exp(res.x))


@functools.lru_cache(maxsize=256)
def boundaries_at(times: tuple[float, ...], alpha: float, spending: str) -> tuple[float, ...]:
    """One-sided critical z per look at the actual fractions `times`, by the named spending (SPENDING)."""
    if spending == "confidence_sequence":
        check_times(times)
        rho = mixture_rho(alpha)
        return tuple(mixture_z(t, alpha, rho) for t in times)
    return spending_boundaries(times, alpha, spending)


def boundaries(design: Design) -> tuple[float, ...]:
    """One-sided z critical value per look of the design, at its planned fractions."""
    return boundaries_at(design.looks, design.alpha, design.spending)


@functools.lru_cache(maxsize=256)
def cumulative_alpha(times: tuple[float, ...], bounds: tuple[float, ...]) -> tuple[float, ...]:
    """Cumulative one-sided alpha actually spent by each look under H0 (exact crossing probabilities)."""
    return tuple(float(x) for x in np.cumsum(exit_probabilities(times, bounds)))


def adjusted_level(z_crit: float) -> float:
    """Two-sided level whose interval's limit is the one-sided z_crit test: 1 - 2 (1 - Phi(z_crit))."""
    return float(1 - 2 * special.ndtr(-z_crit))


def look_sizes(design: Design, n: int) -> tuple[int, ...]:
    """Items at each look: ceil(f * n), at least one more than the previous look, last = n."""
    k = len(design.looks)
    if n < k:
        raise QAError(f"{n} item(s) cannot make {k} sequential looks; use fewer looks or more items")
    out: list[int] = []
    for i, f in enumerate(design.looks):
        size = n if i == k - 1 else min(max(math.ceil(f * n - 1e-9), (out[-1] if out else 0) + 1), n - (k - 1 - i))
        out.append(size)
    return tuple(out)
