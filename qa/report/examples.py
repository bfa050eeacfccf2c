"""Changed answers: the items whose gated score (or extracted answer) differs between the arms, read
from records/<arm>/<task>.jsonl. GPQA items keep only their record id: no target, answer or text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from evals.errors import RecordError
from evals.records.samples import SampleRecord, read_records
from qa.files.comparison import Comparison, Estimate
from qa.files.rundir import RunDir

# items shown by record id only, never text: GPQA (a gated dataset), agentic_bfcl (BFCL's text stays out of reports)
REDACTED_TASK_PREFIXES = ("gpqa", "agentic_bfcl")
MAX_EXAMPLES = 5  # changed answers shown per task and direction
Direction = Literal["regression", "improvement", "answer changed"]
DIRECTIONS: tuple[Direction, ...] = ("regression", "improvement", "answer changed")


@dataclass(frozen=True)
class Example:
    """One item whose gated score differs between the arms (text fields are raw, escape on output)."""

    item_id: str
    repeat: int
    direction: Direction  # regression: baseline scored higher; answer changed: same score, other answer
    target: str | None
    extracted_baseline: str | None
    extracted_candidate: str | None
    completion_baseline: str | None
    completion_candidate: str | None
    truncated_baseline: bool | None = None  # reached max_tokens before its final answer (None: not recorded)
    truncated_candidate: bool | None = None


def redacted(task: str) -> bool:
    """True for tasks whose items may only be named by record id (GPQA, agentic_bfcl)."""
    return task.lower().startswith(REDACTED_TASK_PREFIXES)


def truncation_mark(e: Example) -> str:
    """' (truncated: baseline, candidate)' naming the arms whose sample was truncated, else ''."""
    arms = [arm for arm, t in (("baseline", e.truncated_baseline), ("candidate", e.truncated_candidate)) if t]
    return f" (truncated: {', '.join(arms)})" if arms else ""


def record_ids(examples: list[Example]) -> str:
    """'id#repeat (direction), ...': how a redacted task's changed answers are named."""
    return ", ".join(f"{e.item_id}#{e.repeat} ({e.direction}){truncation_mark(e)}" for e in examples)


def predicted(record: SampleRecord, filter_name: str) -> str | None:
    """The record's answer under `filter_name`, else 'choice i' for the highest log-likelihood."""
    if filter_name in record.extracted:
        return record.extracted[filter_name]
    if record.choice_loglikelihoods:
        best = max(range(len(record.choice_loglikelihoods)), key=record.choice_loglikelihoods.__getitem__)
        return f"choice {best}"
    return None


def _direction(base: SampleRecord, cand: SampleRecord, key: str, filter_name: str) -> Direction | None:
    sb, sc = base.scores.get(key), cand.scores.get(key)
    if sb is None or sc is None:
        return None
    if sb != sc:
        return "regression" if sb > sc else "improvement"
    if base.completion is not None and predicted(base, filter_name) != predicted(cand, filter_name):
        return "answer changed"  # same score, different answer: the signal when accuracy is stuck
    return None


def find_examples(rd: RunDir, comparison: Comparison, est: Estimate) -> list[Example]:
    """Up to MAX_EXAMPLES items per direction whose gated score differs between the arms; [] when the
    records are absent or unreadable."""
    paths = [rd.arm_records(arm) / f"{est.task}.jsonl" for arm in (comparison.baseline, comparison.candidate)]
    if not all(p.is_file() for p in paths):
        return []
    try:
        base, cand = (read_records(p) for p in paths)
    except RecordError:
        return []
    key = f"{est.metric},{est.filter}"
    cand_by = {r.key: r for r in cand}
    hide = redacted(est.task)
    out: dict[Direction, list[Example]] = {d: [] for d in DIRECTIONS}
    for rb in base:
        rc = cand_by.get(rb.key)
        direction = None if rc is None else _direction(rb, rc, key, est.filter)
        if rc is None or direction is None or len(out[direction]) >= MAX_EXAMPLES:
            continue
        out[direction].append(
            Example(
                item_id=rb.item_id,
                repeat=rb.repeat,
                direction=direction,
                target=None if hide else rb.target,
                extracted_baseline=None if hide else predicted(rb, est.filter),
                extracted_candidate=None if hide else predicted(rc, est.filter),
                completion_baseline=None if hide else rb.completion,
                completion_candidate=None if hide else rc.completion,
                truncated_baseline=rb.truncated,
                truncated_candidate=rc.truncated,
            )
        )
    return [e for d in DIRECTIONS for e in out[d]]
