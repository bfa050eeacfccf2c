"""The comparison.json contract: one `Estimate` per (task, metric, filter), one
`DistributionEstimate` per distribution statistic, written by `qa compare`, read by `qa gate`
and `qa report`. The models every section shares (Interval, Estimate, DistributionEstimate, ...) live
in `qa.files.estimates` and are re-exported here; this module holds the sections built on them (cache path,
sequential looks, reference answers), the `Comparison` itself and its file I/O.

Sign convention everywhere: delta = candidate - baseline (negative = the candidate is worse).
Numbers that are undefined for the data at hand (an SE with n < 2, rho with a constant arm) are
`None`, never NaN: JSON has no NaN. Every interval and p-value names the method that produced it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from qa.errors import QAError
from qa.files.estimates import (
    COMPARISON_SCHEMA_VERSION,
    SIGN_CONVENTION,
    Agreement,
    AgreementShare,
    ArmGeneration,
    Bootstrap,
    ChunkValue,
    CIMethod,
    DistributionEstimate,
    DistributionMetric,
    Estimate,
    ExcessFlips,
    Flips,
    Frozen,
    GenerationEstimate,
    Interval,
    McNemar,
    Multiplicity,
    StatsSettings,
)
from qa.files.slices import SliceTable
from quant.fileio import atomic_write_text
from quant.validation import first_error

__all__ = [  # this module's sections and I/O, and the shared models of qa.files.estimates (re-exported)
    "COMPARISON_SCHEMA_VERSION",
    "SIGN_CONVENTION",
    "Agreement",
    "AgreementShare",
    "ArmGeneration",
    "Bootstrap",
    "CIMethod",
    "CacheArm",
    "CacheFloor",
    "CacheKLDelta",
    "CachePathEstimate",
    "CacheTurn",
    "ChunkValue",
    "Comparison",
    "DistributionEstimate",
    "DistributionMetric",
    "Estimate",
    "ExcessFlips",
    "Flips",
    "GenerationEstimate",
    "Interval",
    "McNemar",
    "Multiplicity",
    "ReferenceEstimate",
    "ReferenceStat",
    "SequentialLook",
    "SequentialTask",
    "StatsSettings",
    "load_comparison",
    "save_comparison",
]


class CacheTurn(Frozen):
    """One turn depth (1 = a session's first turn) of one arm's warm-vs-cold pairs (qa.compare.cache_path)."""

    turn: int
    n: int  # (session, repeat) pairs served cold and warm at this depth
    hit_rate: float | None  # warm path: cached / prompt tokens (None: the engine did not say)
    identical: AgreementShare  # completions identical warm vs cold
    first_divergence: float | None  # median character offset of the first difference, over the pairs that differ
    kld: float | None  # mean KL(cold || warm) per token of the teacher-forced continuation, nats
    kld_ci95: Interval | None  # CR1 over sessions
    flips: dict[str, Flips] = Field(default_factory=dict)  # "metric,filter" -> flips (n10: cold scored higher)


class CacheFloor(Frozen):
    """Batch-history A/A floor of one arm: its cold prompts served again in shuffled orders and batch sizes."""

    n: int
    identical_outputs: AgreementShare  # bit-identical greedy completions, shuffled vs cold
    identical_topk: AgreementShare | None  # bit-identical top-k ids and log-probs of the continuation
    kld: float | None  # mean KL(cold || shuffled) per token, nats


class CacheArm(Frozen):
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


class CacheKLDelta(Frozen):
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


class ReferenceStat(Frozen):
    """A mean over items, SE CR1 over the items' clusters; the gate reads its t interval from se and df."""

    value: float
    se: float | None
    df: int | None
    ci95: Interval | None


class ReferenceEstimate(Frozen):
    """The reference-answer signal of one task (qa.compare.reference): per item (repeats averaged first) the
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


class CachePathEstimate(Frozen):
    """The cache path of one sessions task, the candidate's warm-vs-cold divergence next to the baseline's
    (its floor). excess_flips: X = candidate warm != cold, the "rerun" side = the baseline's warm != cold;
    accuracy: the candidate's warm path vs the baseline's cold path (per "metric,filter")."""

    task: str
    baseline: CacheArm
    candidate: CacheArm
    kld: CacheKLDelta | None = None
    excess_flips: dict[str, ExcessFlips] = Field(default_factory=dict)
    accuracy: list[Estimate] = Field(default_factory=list)
    # the candidate's warm path vs the baseline's cold path on the turns' teacher-forced reference answers
    warm_reference: ReferenceEstimate | None = None
    notes: list[str] = Field(default_factory=list)


class SequentialLook(Frozen):
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


class SequentialTask(Frozen):
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


class Comparison(Frozen):
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
    # sequential looks
    sequential: list[SequentialTask] = Field(default_factory=list)  # sequential policies only
    # the reference-answer signal
    reference: list[ReferenceEstimate] = Field(default_factory=list)  # tasks with reference answers
    # the cache path (warm / cold serving)
    cache_path: list[CachePathEstimate] = Field(default_factory=list)  # sessions tasks: warm vs cold per arm
    # per-slice tables
    slices: list[SliceTable] = Field(default_factory=list)  # per turn depth / context length / kind (qa.files.slices)
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
    """Read and validate comparison.json (schema 2; a schema-1 file is refused, naming the script that
    migrates it); a missing or invalid file is a one-line QAError."""
    if path.is_dir():
        path = path / "comparison.json"
    if not path.exists():
        raise QAError(f"{path}: no comparison.json; run `qa compare BASE CAND --out DIR` first")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise QAError(f"{path}: not valid JSON ({exc.msg}); re-run `qa compare`") from None
    if isinstance(data, dict) and data.get("schema_version") == 1:
        raise QAError(f"{path}: schema 1 comparison.json: run python -m scripts.migrate_comparisons")
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
