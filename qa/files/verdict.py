"""The verdict.json contract: overall status, one TaskVerdict per task, the rules behind each; and the
run-level verdict.json of a several-candidate run (RunVerdict: one CandidateVerdict per candidate)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from qa.errors import QAError
from qa.files.comparison import Interval
from qa.files.policy import Policy
from quant.fileio import atomic_write_text

VERDICT_SCHEMA_VERSION = 1
RUN_VERDICT_KIND = "candidates"
Status = Literal["pass", "fail", "inconclusive"]
Kind = Literal["decided", "errors", "no_information", "underpowered", "undefined", "missing"]
RuleName = Literal["noninferiority", "tost", "sigma", "truncation",
                   "cache_hit_rate", "cache_flips", "cache_kl", "cache_accuracy",  # cache_*: qa.gate.cache_path
                   "cache_reference_logprob", "cache_reference_kl",
                   "reference_logprob", "reference_kl"]  # reference_*: qa.gate.reference
EXIT_CODES: dict[str, int] = {"pass": 0, "fail": 1, "inconclusive": 3}
V = TypeVar("V", bound=BaseModel)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RuleResult(_Frozen):
    """One rule applied to one task; `decides` is False for a rule that is only reported."""

    rule: RuleName
    decides: bool
    status: Status
    detail: str  # one line, the numbers that decided it
    ci_level: float | None = None  # two-sided level of the CI used (0.90 for alpha = 0.05)
    ci: Interval | None = None
    ci_method: str | None = None
    margin: float | None = None
    k: float | None = None
    basis: str | None = None
    threshold: float | None = None  # sigma rule: k * SE_basis
    false_alarm_rate: float | None = None  # sigma rule: P(an identical candidate fails it)
    drop_caught_80: float | None = None  # sigma rule: true drop it catches with 80% probability


class TaskVerdict(_Frozen):
    """The gate's decision for one task: status, why (one line), and the rules behind it."""

    task: str
    metric: str  # "metric,filter"
    status: Status
    kind: Kind
    reason: str
    n: int = 0
    delta: float | None = None
    se_paired: float | None = None
    margin: float
    alpha: float
    mde: float | None = None  # at the policy's alpha and power, metric units
    n_needed: int | None = None  # items for MDE <= margin at this sd of differences
    repeats_needed: int | None = None  # repeats for MDE <= margin at this n (None: unknown or cannot)
    p_worse: float | None = None  # one-sided p for H0: delta >= -margin ("demonstrably worse")
    p_worse_holm: float | None = None  # the same, Holm-adjusted across the gated tasks
    error_rate_baseline: float | None = None
    error_rate_candidate: float | None = None
    rules: list[RuleResult] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)


class Verdict(_Frozen):
    """The whole verdict.json: overall status, a one-line summary, one TaskVerdict per task."""

    schema_version: Literal[1] = VERDICT_SCHEMA_VERSION
    status: Status
    summary: str
    baseline: str
    candidate: str
    sign_convention: str
    tasks: list[TaskVerdict]
    policy: Policy
    policy_sha256: str
    comparison_sha256: str | None = None

    @property
    def exit_code(self) -> int:
        """0 pass, 1 fail, 3 inconclusive."""
        return EXIT_CODES[self.status]


class CandidateVerdict(_Frozen):
    """One candidate of a several-candidate run: its status, summary, per-task statuses, and where its
    own verdict.json and report are (relative to the run directory)."""

    name: str
    status: Status
    summary: str
    tasks: dict[str, Status]  # task -> status, in the candidate verdict's order
    reasons: dict[str, str] = Field(default_factory=dict)  # task -> one-line reason
    folder: str  # candidates/<name>


class RunVerdict(_Frozen):
    """verdict.json at the root of a several-candidate run: every candidate gated on its own against the
    same baseline; the run passes only when every candidate passes (any fail: fail; else inconclusive)."""

    schema_version: Literal[1] = VERDICT_SCHEMA_VERSION
    kind: Literal["candidates"] = RUN_VERDICT_KIND
    status: Status
    summary: str
    baseline: str
    passed: list[str]  # the candidates that passed
    candidates: list[CandidateVerdict]
    policy_name: str
    policy_sha256: str

    @property
    def exit_code(self) -> int:
        """0 when every candidate passed, 1 when any failed, else 3."""
        return EXIT_CODES[self.status]


def save_run_verdict(path: Path, verdict: RunVerdict) -> None:
    """Write the run-level verdict.json atomically."""
    save_verdict(path, verdict)


def load_run_verdict(path: Path) -> RunVerdict:
    """Read a run-level verdict.json; a missing or invalid file is a one-line QAError."""
    return _load(path, RunVerdict, "run-level verdict.json")


def save_verdict(path: Path, verdict: Verdict | RunVerdict) -> None:
    """Write verdict.json atomically."""
    atomic_write_text(path, verdict.model_dump_json(indent=2) + "\n")


def _load(path: Path, model: type[V], what: str) -> V:
    if not path.is_file():
        raise QAError(f"{path}: no verdict.json; run `qa gate RUN_DIR` first")
    try:
        return model.model_validate_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise QAError(f"{path}: invalid {what} ({str(exc).splitlines()[0]}); re-run `qa gate`") from None


def load_verdict(path: Path) -> Verdict:
    """Read verdict.json; a missing or invalid file is a one-line QAError."""
    return _load(path, Verdict, "verdict.json")
