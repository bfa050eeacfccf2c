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

COMPARISON_SCHEMA_VERSION = 2
SIGN_CONVENTION = "delta = candidate - baseline (negative = candidate worse); ddof = 1"

CIMethod = Literal["paired_t", "cluster_cr1_t", "tango_score", "degenerate"]
DistributionMetric = Literal["kld", "top1_agree", "delta_p", "log_ppl_ratio"]


class _Frozen(BaseModel):
    # NaN/inf would be written as null and then refuse to load: refuse them when a model is built.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Interval(_Frozen):
    """A two-sided interval [lower, upper] in the units of the statistic."""

    lower: float
    upper: float


class McNemar(_Frozen):
    """McNemar on the discordant *items* of binary scores: n10 = items where the baseline scored higher
    (regressions), n01 = the reverse. Exact: two-sided binomial, p = min(1, 2 P(X <= min)); mid-p: exact
    minus P(X = n10) (Fagerland et al. 2013). With one repeat this is McNemar's test (`method`
    "mcnemar"); with K > 1 repeats it is the same exact test on item-mean differences, the sign test
    ("sign_test_items"): (item, repeat) pairs are not independent. n10 == n01 gives p = 1 for both."""

    n10: int
    n01: int
    p_exact: float
    p_midp: float
    unit: Literal["item"] = "item"
    method: Literal["mcnemar", "sign_test_items"] = "mcnemar"


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
    """Across the estimates of one comparison: Benjamini-Hochberg q on the two-sided paired p for
    delta = 0 (flags for sub-tasks only, never the gate; each task's gate test stays at alpha,
    intersection-union). The "any task demonstrably worse" Holm guard depends on the margin: the gate
    computes it."""

    p_diff: float | None
    q_bh: float | None


class Estimate(_Frozen):
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
    items_worse: int | None = None  # items whose difference is < 0 (None: not known, v1 files)
    items_better: int | None = None  # items whose difference is > 0
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


class ArmGeneration(_Frozen):
    """One arm's generation lengths on one task, over the (item, repeat) samples paired with the
    other arm. The truncation interval is Wilson's; with repeats or cluster keys it is Wilson's on
    the effective sample size p (1 - p) / SE_CR1^2 (the number of clusters when p is 0 or 1)."""

    n_samples: int  # samples whose truncation is recorded in both arms
    truncated: int  # of those, samples that reached max_tokens before their final answer
    truncation_rate: float | None = None  # truncated / n_samples (None: n_samples = 0)
    truncation_ci95: Interval | None = None
    n_output_tokens: int = 0  # samples whose output token count is recorded in both arms
    mean_output_tokens: float | None = None  # per sample, over those


class GenerationEstimate(_Frozen):
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


class CacheTurn(_Frozen):
    """One turn depth (1 = a session's first turn) of one arm's warm-vs-cold pairs (qa.stats.cache_path)."""

    turn: int
    n: int  # (session, repeat) pairs served cold and warm at this depth
    hit_rate: float | None  # warm path: cached / prompt tokens (None: the engine did not say)
    identical: AgreementShare  # completions identical warm vs cold
    first_divergence: float | None  # median character offset of the first difference, over the pairs that differ
    kld: float | None  # mean KL(cold || warm) per token of the teacher-forced continuation, nats
    kld_ci95: Interval | None  # CR1 over sessions
    flips: dict[str, Flips] = Field(default_factory=dict)  # "metric,filter" -> flips (n10: cold scored higher)


class CacheFloor(_Frozen):
    """Batch-history A/A floor of one arm: its cold prompts served again in shuffled orders and batch sizes."""

    n: int
    identical_outputs: AgreementShare  # bit-identical greedy completions, shuffled vs cold
    identical_topk: AgreementShare | None  # bit-identical top-k ids and log-probs of the continuation
    kld: float | None  # mean KL(cold || shuffled) per token, nats


class CacheArm(_Frozen):
    """One arm's warm path against its own cold path on the same (session, turn, repeat), fields as in
    CacheTurn; hit rates None when the engine did not say, token counts summed over the warm path."""

    arm: str
    n: int
    n_sessions: int
    prompt_tokens: int | None
    cached_tokens: int | None
    hit_rate: float | None
    cold_hit_rate: float | None  # 0 when the cold reset worked
    identical: AgreementShare
    diverged: int  # pairs with different completions
    first_divergence: float | None
    kld: DistributionEstimate | None  # KL(cold || warm), CR1 by session
    top1_agree: DistributionEstimate | None
    flips: dict[str, Flips] = Field(default_factory=dict)
    per_turn: list[CacheTurn] = Field(default_factory=list)
    floor: CacheFloor | None = None


class CacheKLDelta(_Frozen):
    """Candidate's KL(cold || warm) minus the baseline's per (session, turn, repeat) unit (token mean within
    a unit), SE CR1 by session; the gate reads its t interval at its own level from se and df."""

    n: int
    n_clusters: int
    mean_baseline: float
    mean_candidate: float
    delta: float
    se: float | None
    df: int | None
    ci90: Interval | None
    ci95: Interval | None


class CachePathEstimate(_Frozen):
    """The cache path of one sessions task, the candidate's warm-vs-cold divergence next to the baseline's
    (its floor). excess_flips: X = candidate warm != cold, the "rerun" side = the baseline's warm != cold;
    accuracy: the candidate's warm path vs the baseline's cold path (per "metric,filter")."""

    task: str
    baseline: CacheArm
    candidate: CacheArm
    kld: CacheKLDelta | None = None
    excess_flips: dict[str, ExcessFlips] = Field(default_factory=dict)
    accuracy: list[Estimate] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class StatsSettings(_Frozen):
    """The parameters the statistics were computed with (none of them is a decision threshold:
    margins, alpha and the sigma rule's k live in the gate policy)."""

    bootstrap_n: int = Field(default=2000, ge=0)  # 0 disables the bootstrap
    seed: int = 0
    tango_max_discordant: int = Field(default=30, ge=0)  # Tango below this many discordant items


class SequentialLook(_Frozen):
    """One interim look of a sequential task (qa.gate.sequential): the adjusted two-sided interval of delta
    at this look's level, and what it decided. z_crit is the one-sided critical value from the design's
    spending (qa.stats.sequential); adjusted_level = 1 - 2 (1 - Phi(z_crit)); lower/upper None: undefined."""

    look: int  # 0-based
    fraction: float  # information fraction: paired items n / n_planned
    n: int  # paired items at this look
    z_crit: float
    adjusted_level: float
    alpha_spent: float | None = None  # cumulative one-sided alpha spent up to this look
    lower: float | None = None
    upper: float | None = None
    decision: Literal["pass", "fail", "continue"]


class SequentialTask(_Frozen):
    """The looks of one task under a sequential policy: where it stopped and how many items that saved.
    decision "final": it ran to the last look, where the gate decides as at fixed n (adjusted level)."""

    task: str
    metric: str
    filter: str
    spending: str
    looks: list[SequentialLook] = Field(default_factory=list)
    n_planned: int
    stopped_at: int | None = None  # look index where it stopped early (pass/fail); None: did not stop early
    decision: Literal["pass", "fail", "continue", "final"]
    items_used: int
    items_saved: int


class ReferenceStat(_Frozen):
    """A mean over items, SE CR1 over the items' clusters; the gate reads its t interval from se and df."""

    value: float
    se: float | None
    df: int | None
    ci95: Interval | None


class ReferenceEstimate(_Frozen):
    """The reference-answer signal of one task (qa.stats.reference): per item (repeats averaged first) the
    change in mean log-prob of its reference tokens (candidate - baseline, nats/token) and the mean
    KL(baseline || candidate) over them. n = 0 with `unavailable`: an arm's engine gave no log-probs."""

    task: str
    n: int  # paired items scored in both arms
    n_clusters: int
    n_tokens: int  # reference tokens over those items (one repeat each)
    n_missing: int  # paired samples without reference log-probs in an arm
    unavailable: str | None = None
    mean_logprob_baseline: float | None = None  # nats/token, mean over items
    mean_logprob_candidate: float | None = None
    delta_logprob: ReferenceStat | None = None
    kld: ReferenceStat | None = None
    kld_p99: float | None = None  # per-token KL percentiles
    kld_max: float | None = None
    floor_delta_logprob: float | None = None  # baseline rerun vs baseline (A/A floor)
    floor_kld: float | None = None
    notes: list[str] = Field(default_factory=list)


class Comparison(_Frozen):
    """The whole comparison.json."""

    schema_version: Literal[2] = COMPARISON_SCHEMA_VERSION
    sign_convention: str = SIGN_CONVENTION
    baseline: str
    candidate: str
    rerun: str | None = None  # label of the optional baseline-rerun arm
    settings: StatsSettings = Field(default_factory=StatsSettings)
    estimates: list[Estimate] = Field(default_factory=list)
    distribution: list[DistributionEstimate] = Field(default_factory=list)
    generation: list[GenerationEstimate] = Field(default_factory=list)  # generative tasks: truncation, length
    # (issue 17, sequential looks: fields below this line)
    sequential: list[SequentialTask] = Field(default_factory=list)  # sequential policies only
    # (issue 17, reference-answer signal: fields below this line)
    reference: list[ReferenceEstimate] = Field(default_factory=list)  # tasks with reference answers
    # (issue 15, cache path: fields below this line)
    cache_path: list[CachePathEstimate] = Field(default_factory=list)  # sessions tasks: warm vs cold per arm
    notes: list[str] = Field(default_factory=list)

    def generation_for(self, task: str) -> GenerationEstimate | None:
        """The task's truncation and output-length estimate, None when not recorded."""
        return next((g for g in self.generation if g.task == task), None)

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
    """Read and validate comparison.json (schema 2, or schema 1 migrated in memory); a missing or
    invalid file is a one-line QAError."""
    if path.is_dir():
        path = path / "comparison.json"
    if not path.exists():
        raise QAError(f"{path}: no comparison.json; run `qa compare BASE CAND --out DIR` first")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise QAError(f"{path}: not valid JSON ({exc.msg}); re-run `qa compare`") from None
    if isinstance(data, dict) and data.get("schema_version") == 1:
        from qa.comparison_v1 import migrate_v1

        data = migrate_v1(data)
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
