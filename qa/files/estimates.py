"""The numbers of comparison.json that every section shares: intervals, tests, flips, agreement, the
per-(task, metric, filter) `Estimate` and the per-statistic `DistributionEstimate`, and the settings they
were computed with. `qa.files.comparison` builds the file's sections on them (and re-exports them).

Sign convention everywhere: delta = candidate - baseline (negative = the candidate is worse).
Numbers that are undefined for the data at hand (an SE with n < 2, rho with a constant arm) are
`None`, never NaN: JSON has no NaN. Every interval and p-value names the method that produced it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

COMPARISON_SCHEMA_VERSION = 2
SIGN_CONVENTION = "delta = candidate - baseline (negative = candidate worse); ddof = 1"

CIMethod = Literal["paired_t", "cluster_cr1_t", "tango_score", "degenerate"]
DistributionMetric = Literal["kld", "top1_agree", "delta_p", "log_ppl_ratio"]


class Frozen(BaseModel):
    """The base of every comparison.json model: frozen, no extra fields, no NaN."""

    # NaN/inf would be written as null and then refuse to load: refuse them when a model is built.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Interval(Frozen):
    """A two-sided interval [lower, upper] in the units of the statistic."""

    lower: float
    upper: float


class McNemar(Frozen):
    """McNemar on the discordant *items* of binary scores: n10 = items where the baseline is better
    (regressions: it scored higher, or lower for a lower-is-better metric, qa.compare.direction), n01 = the
    reverse (improvements). Exact: two-sided binomial, p = min(1, 2 P(X <= min)); mid-p: exact
    minus P(X = n10) (Fagerland et al. 2013). With one repeat this is McNemar's test (`method`
    "mcnemar"); with K > 1 repeats it is the same exact test on item-mean differences, the sign test
    ("sign_test_items"): (item, repeat) pairs are not independent. n10 == n01 gives p = 1 for both."""

    n10: int
    n01: int
    p_exact: float
    p_midp: float
    unit: Literal["item"] = "item"
    method: Literal["mcnemar", "sign_test_items"] = "mcnemar"


class Flips(Frozen):
    """Share of (item, repeat) pairs whose score differs between arms, both directions, with
    Wilson 95% intervals. For non-binary scores a flip is any unequal score. Regressions and improvements
    follow the metric's direction (qa.compare.direction)."""

    n: int
    n10: int  # baseline better (regressions): scored higher, or lower for a lower-is-better metric
    n01: int  # candidate better (improvements)
    rate: float
    ci95: Interval
    regress_rate: float
    regress_ci95: Interval
    improve_rate: float
    improve_ci95: Interval


class AgreementShare(Frozen):
    """Share of (item, repeat) pairs whose text is identical in both arms, Wilson 95% interval."""

    n: int
    agree: int
    share: float
    ci95: Interval


class Agreement(Frozen):
    """Generative tasks only: identical extracted answers (this filter) and identical completions.
    It moves even when accuracy is stuck at 0, and it is what a KV-cache fault changes first."""

    extracted: AgreementShare | None
    completion: AgreementShare | None


class ExcessFlips(Frozen):
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


class Bootstrap(Frozen):
    """Paired bootstrap of delta: items (or whole clusters) resampled with both arms together,
    BCa intervals, generator numpy default_rng(seed)."""

    n_resamples: int
    seed: int
    unit: Literal["item", "cluster"]
    method: Literal["BCa", "degenerate"]
    ci90: Interval | None
    ci95: Interval | None


class Multiplicity(Frozen):
    """Across the estimates of one comparison: Benjamini-Hochberg q on the two-sided paired p for
    delta = 0 (flags for sub-tasks only, never the gate; each task's gate test stays at alpha,
    intersection-union). The "any task demonstrably worse" Holm guard depends on the margin: the gate
    computes it."""

    p_diff: float | None
    q_bh: float | None


class Estimate(Frozen):
    """Everything `qa compare` knows about one (task, metric, filter): numbers, no decisions;
    delta = candidate - baseline. `qa.stats.intervals.delta_interval` gives its interval at any level."""

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
    mean_baseline: float | None = None
    mean_candidate: float | None = None
    delta: float | None = None
    sd_baseline: float | None = None  # sd of the per-item means, ddof = 1 (None: n < 2 or unknown)
    sd_candidate: float | None = None
    se_baseline: float | None = None
    se_candidate: float | None = None
    se_unpaired: float | None = None
    se_paired: float | None = None
    sd_diff: float | None = None  # sd of the per-item differences (design-effect adjusted when clustered)
    sd_within: float | None = None  # pooled within-item sd of per-repeat differences (repeats >= 2)
    df: int | None = None  # t degrees of freedom: n - 1, or clusters - 1
    rho: float | None = None  # Pearson correlation of the per-item means of the two arms
    score_range: float = 1.0  # largest |score| (at least 1): bounds a difference for the degenerate interval
    # items where the candidate is worse / better, by the metric's direction (`higher_is_better`): the
    # difference d = candidate - baseline is < 0 / > 0, or > 0 / < 0 for a lower-is-better metric (None: v1)
    items_worse: int | None = None
    items_better: int | None = None
    higher_is_better: bool = True  # the metric's direction (qa.compare.direction)
    ci_method: CIMethod
    ci90: Interval | None = None
    ci95: Interval | None = None
    mcnemar: McNemar | None = None  # binary scores only
    flips: Flips | None = None
    agreement: Agreement | None = None  # generative tasks only
    bootstrap: Bootstrap | None = None
    multiplicity: Multiplicity | None = None
    excess_flips: ExcessFlips | None = None  # only with a baseline-rerun arm
    notes: list[str] = Field(default_factory=list)  # about the method, never about a decision

    def items_by_sign(self) -> tuple[int, int] | None:
        """(items with d > 0, items with d < 0) whatever the direction (None: not known, v1 files)."""
        if self.items_better is None or self.items_worse is None:
            return None
        up, down = self.items_better, self.items_worse
        return (up, down) if self.higher_is_better else (down, up)


class ArmGeneration(Frozen):
    """One arm's generation lengths on one task, over the (item, repeat) samples paired with the
    other arm. The truncation interval is Wilson's; with repeats or cluster keys it is Wilson's on
    the effective sample size p (1 - p) / SE_CR1^2 (the number of clusters when p is 0 or 1)."""

    n_samples: int  # samples whose truncation is recorded in both arms
    truncated: int  # of those, samples that reached max_tokens before their final answer
    truncation_rate: float | None = None  # truncated / n_samples (None: n_samples = 0)
    truncation_ci95: Interval | None = None
    n_output_tokens: int = 0  # samples whose output token count is recorded in both arms
    mean_output_tokens: float | None = None  # per sample, over those


class GenerationEstimate(Frozen):
    """Truncation and output length of one generative task: per arm, and paired (delta = candidate -
    baseline per item, repeats averaged first, by the accuracy machinery). `truncation` is the change
    in the truncation rate (metric "truncated": 1 per truncated sample; positive = the candidate runs
    out of budget more often); `output_tokens` the change in mean output tokens per sample. None: not
    recorded (records written before truncation was recorded, or the engine gives no token count)."""

    task: str
    n_unrecorded: int  # (item, repeat) samples whose truncation is missing in either arm
    baseline: ArmGeneration
    candidate: ArmGeneration
    truncation: Estimate | None = None
    output_tokens: Estimate | None = None


class ChunkValue(Frozen):
    """One text chunk's value of a distribution statistic (token-weighted within the chunk)."""

    chunk: str
    n_tokens: int
    value: float


class DistributionEstimate(Frozen):
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


class StatsSettings(Frozen):
    """The parameters the statistics were computed with (none of them is a decision threshold:
    margins, alpha and the sigma rule's k live in the gate policy)."""

    bootstrap_n: int = Field(default=2000, ge=0)  # 0 disables the bootstrap
    seed: int = 0
    tango_max_discordant: int = Field(default=30, ge=0)  # Tango below this many discordant items
