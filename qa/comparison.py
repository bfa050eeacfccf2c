"""The comparison.json contract: one `Estimate` per (task, metric, filter), one
`DistributionEstimate` per distribution statistic, written by `qa compare`, read by `qa gate`
and `qa report`.

Sign convention everywhere: delta = candidate - baseline (negative = the candidate is worse).
Numbers that are undefined for the data at hand (an SE with n < 2, rho with a constant arm) are
`None`, never NaN: JSON has no NaN. Every interval and p-value names the method that produced it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qa.errors import QAError
from quant.fileio import atomic_write_text
from quant.validation import first_error

COMPARISON_SCHEMA_VERSION = 1
SIGN_CONVENTION = "delta = candidate - baseline (negative = candidate worse); ddof = 1"

Verdict = Literal["pass", "fail", "inconclusive", "underpowered", "no_information"]
SEBasis = Literal["baseline", "unpaired", "paired"]
CIMethod = Literal["paired_t", "cluster_cr1_t", "tango_score", "degenerate"]
DistributionMetric = Literal["kld", "top1_agree", "delta_p", "log_ppl_ratio"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Interval(_Frozen):
    """A two-sided interval [lower, upper] in the units of the statistic."""

    lower: float
    upper: float


class SigmaRule(_Frozen):
    """The release-notes rule |delta| <= k * SE_basis, with its weaknesses quantified.

    `false_alarm_rate`: probability that an identical candidate fails the rule,
    2 * (1 - Phi(k * SE_basis / SE_paired)) (normal approximation). `drop_caught_80`: the true drop
    (accuracy units, positive) the rule catches with 80% probability, k * SE_basis + z_0.8 * SE_paired.
    """

    k: float
    basis: SEBasis
    se: float | None
    threshold: float | None  # k * se
    ratio: float | None  # |delta| / se; None when se is 0 or undefined
    passed: bool | None  # None when the SE is undefined
    false_alarm_rate: float | None
    drop_caught_80: float | None


class NonInferiority(_Frozen):
    """H0: delta <= -margin vs H1: delta > -margin, decided on the (1 - 2 alpha) CI.

    pass iff the CI's lower limit > -margin; fail iff its upper limit < -margin; otherwise
    inconclusive, or underpowered when the MDE exceeds the margin; no_information when both arms
    sit at the same floor or ceiling. `p` is one-sided for H0.
    """

    margin: float
    alpha: float
    ci: Interval | None
    p: float | None
    p_worse: float | None  # one-sided p for H0: delta >= -margin (the "demonstrably worse" guard)
    method: CIMethod
    verdict: Verdict


class TOST(_Frozen):
    """Two one-sided tests for equivalence within (-margin, +margin) on the (1 - 2 alpha) CI.
    pass iff the CI lies inside; fail iff it lies wholly outside; `p` = max of the two one-sided p."""

    margin: float
    alpha: float
    p: float | None
    method: CIMethod
    verdict: Verdict


class McNemar(_Frozen):
    """McNemar on the discordant (item, repeat) pairs of binary scores: n10 = baseline right and
    candidate wrong (regressions), n01 = the reverse. Exact: two-sided binomial, p = min(1, 2 P(X <=
    min)); mid-p: exact minus P(X = n10) (Fagerland et al. 2013). n10 == n01 gives p = 1 for both."""

    n10: int
    n01: int
    p_exact: float
    p_midp: float
    unit: Literal["item", "item_repeat"]


class Flips(_Frozen):
    """Share of (item, repeat) pairs whose score differs between arms, both directions, with
    Wilson 95% intervals. For non-binary scores a flip is any unequal score."""

    n: int
    n10: int  # baseline scored higher (regressions)
    n01: int  # candidate scored higher (improvements)
    rate: float
    ci95: Interval
    regress_rate: float
    regress_ci95: Interval
    improve_rate: float
    improve_ci95: Interval


class AgreementShare(_Frozen):
    """Share of (item, repeat) pairs whose text is identical in both arms, Wilson 95% interval."""

    n: int
    agree: int
    share: float
    ci95: Interval


class Agreement(_Frozen):
    """Generative tasks only: identical extracted answers (this filter) and identical completions.
    It moves even when accuracy is stuck at 0, and it is what a KV-cache fault changes first."""

    extracted: AgreementShare | None
    completion: AgreementShare | None


class ExcessFlips(_Frozen):
    """Third arm (a baseline rerun): do candidate flips exceed the engine's own nondeterminism?
    Per (item, repeat): X = [cand != base], Y = [rerun != base]; exact one-sided sign test on the
    discordant pairs (H1: X=1,Y=0 more often than X=0,Y=1), p = P(Bin(m, 1/2) >= only_candidate)."""

    n: int
    flips_candidate: int
    flips_rerun: int
    only_candidate: int
    only_rerun: int
    p_excess: float
    rerun_rate: float
    rerun_ci95: Interval
    aa_delta: float | None  # rerun - baseline mean (the A/A delta)
    aa_z: float | None  # A/A delta / its paired SE: should look standard normal over history


class Bootstrap(_Frozen):
    """Paired bootstrap of delta: items (or whole clusters) resampled with both arms together,
    BCa intervals, generator numpy default_rng(seed)."""

    n_resamples: int
    seed: int
    unit: Literal["item", "cluster"]
    method: Literal["BCa", "degenerate"]
    ci90: Interval | None
    ci95: Interval | None


class Multiplicity(_Frozen):
    """Across the estimates of one comparison: Holm on `p_worse` (the "fail if any task is
    demonstrably worse" guard) and Benjamini-Hochberg on the two-sided paired p for delta = 0
    (flags only, never the gate). Each task's own gate test stays at alpha (intersection-union)."""

    p_worse_holm: float | None
    p_diff: float | None
    q_bh: float | None


class Estimate(_Frozen):
    """Everything `qa compare` knows about one (task, metric, filter); delta = candidate - baseline."""

    task: str
    metric: str
    filter: str
    task_version: str | None = None
    binary: bool
    n: int  # paired items used
    repeats: int  # repeats per item (the most any item has)
    n_clusters: int  # distinct cluster keys (an item without one is its own cluster)
    n_errors_baseline: int  # (item, repeat) samples with no score in the baseline (excluded from both arms)
    n_errors_candidate: int
    n_dropped_items: int  # items with no scored repeat left after dropping errors
    mean_baseline: float | None
    mean_candidate: float | None
    delta: float | None
    se_baseline: float | None
    se_candidate: float | None
    se_unpaired: float | None
    se_paired: float | None
    sd_diff: float | None  # sd of the per-item differences (design-effect adjusted when clustered)
    df: int | None  # t degrees of freedom: n - 1, or clusters - 1
    rho: float | None  # Pearson correlation of the per-item means of the two arms
    ci_method: CIMethod
    ci90: Interval | None
    ci95: Interval | None
    sigma_rule: SigmaRule
    noninferiority: NonInferiority
    tost: TOST
    mcnemar: McNemar | None  # binary scores only
    flips: Flips | None
    agreement: Agreement | None  # generative tasks only
    bootstrap: Bootstrap | None
    mde: float | None  # (z_{1-alpha} + z_0.8) * SE_paired, accuracy units
    # items needed for MDE <= margin at this sd of differences and repeats; when every difference is 0
    # (sd 0), the items for which 0 observed differences bound the differing share below the margin
    # at level alpha: ceil(ln(alpha) / ln(1 - margin))
    n_needed: int | None
    repeats_needed: int | None  # repeats needed at this n (None: repeats cannot get there / unknown)
    information: bool  # False when both arms sit at the same floor or ceiling
    multiplicity: Multiplicity | None = None
    excess_flips: ExcessFlips | None = None  # only with a baseline-rerun arm
    notes: list[str] = Field(default_factory=list)


class ChunkValue(_Frozen):
    """One text chunk's value of a distribution statistic (token-weighted within the chunk)."""

    chunk: str
    n_tokens: int
    value: float


class DistributionEstimate(_Frozen):
    """A teacher-forced distribution statistic over tokens, SE clustered by chunk (CR1, G - 1 df).

    kld: mean KL(base || cand) per token, nats, over the baseline's top-k plus one tail bucket
    (a lower bound of the true KL); top1_agree: share of positions with the same top-1 token;
    delta_p: mean p_cand(next) - p_base(next); log_ppl_ratio: mean NLL_cand - mean NLL_base per
    token = log(PPL_cand / PPL_base).
    """

    task: str
    metric: DistributionMetric
    filter: Literal["none"] = "none"
    n_tokens: int
    n_chunks: int
    value: float
    se: float | None  # clustered by chunk
    se_naive: float | None  # tokens treated as independent (what llama.cpp prints), for contrast
    ci95: Interval | None
    p99: float | None = None  # kld only
    p999: float | None = None  # kld only
    max: float | None = None  # kld only
    per_chunk: list[ChunkValue] = Field(default_factory=list)
    floor_value: float | None = None  # the same statistic for baseline rerun vs baseline (noise floor)
    notes: list[str] = Field(default_factory=list)


class TaskOverride(_Frozen):
    """Per-task replacements for StatsConfig fields (None: keep the default)."""

    margin: float | None = Field(default=None, gt=0, lt=1)
    alpha: float | None = Field(default=None, gt=0, lt=0.5)
    k: float | None = Field(default=None, gt=0)
    basis: SEBasis | None = None


class StatsConfig(_Frozen):
    """The parameters estimates are computed with; recorded in comparison.json (a gate may
    re-decide verdicts from the numbers with another policy). margin is in score units (0.02 = 2
    accuracy points); alpha is one-sided, so the decision CI is (1 - 2 alpha)."""

    margin: float = Field(default=0.02, gt=0, lt=1)
    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    k: float = Field(default=1.5, gt=0)
    basis: SEBasis = "baseline"
    power: float = Field(default=0.8, gt=0, lt=1)
    bootstrap_n: int = Field(default=2000, ge=0)  # 0 disables the bootstrap
    seed: int = 0
    tango_max_discordant: int = Field(default=30, ge=0)  # Tango below this many discordant pairs
    overrides: dict[str, TaskOverride] = Field(default_factory=dict)  # task name -> override

    def for_task(self, task: str) -> StatsConfig:
        """This config with `task`'s override applied (the override map itself is dropped)."""
        o = self.overrides.get(task)
        if o is None:
            return self.model_copy(update={"overrides": {}})
        update = {k: v for k, v in o.model_dump().items() if v is not None}
        return self.model_copy(update={**update, "overrides": {}})


class Comparison(_Frozen):
    """The whole comparison.json."""

    schema_version: Literal[1] = COMPARISON_SCHEMA_VERSION
    sign_convention: str = SIGN_CONVENTION
    baseline: str
    candidate: str
    rerun: str | None = None  # label of the optional baseline-rerun arm
    settings: StatsConfig
    estimates: list[Estimate] = Field(default_factory=list)
    distribution: list[DistributionEstimate] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    def estimate(self, task: str, metric: str, filter: str) -> Estimate:
        """The estimate for one (task, metric, filter); QAError naming what exists otherwise."""
        for e in self.estimates:
            if (e.task, e.metric, e.filter) == (task, metric, filter):
                return e
        have = ", ".join(f"{e.task}/{e.metric},{e.filter}" for e in self.estimates[:8])
        raise QAError(f"no estimate for {task}/{metric},{filter} in this comparison (have: {have})")


def save_comparison(path: Path, comparison: Comparison) -> None:
    """Write comparison.json atomically (temp file, fsync, rename)."""
    atomic_write_text(path, comparison.model_dump_json(indent=2) + "\n")


def load_comparison(path: Path) -> Comparison:
    """Read and validate comparison.json; a missing or invalid file is a one-line QAError."""
    if path.is_dir():
        path = path / "comparison.json"
    if not path.exists():
        raise QAError(f"{path}: no comparison.json; run `qa compare BASE CAND --out DIR` first")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise QAError(f"{path}: not valid JSON ({exc.msg}); re-run `qa compare`") from None
    if not isinstance(data, dict) or data.get("schema_version") != COMPARISON_SCHEMA_VERSION:
        version = data.get("schema_version") if isinstance(data, dict) else None
        raise QAError(
            f"{path}: comparison schema_version {version!r}, this toolkit reads "
            f"{COMPARISON_SCHEMA_VERSION}; re-run `qa compare`"
        )
    try:
        return Comparison.model_validate(data)
    except ValidationError as exc:
        err = first_error(exc)
        raise QAError(f"{path}: invalid comparison ({err.where}: {err.msg}); re-run `qa compare`") from None
