"""What a run is made of and what of it is already on disk, shared by both runners (evals.run.runner,
evals.run.sessions): the samples of a selection (item x repeat, each with its request and prompt
hash), the check that records already on disk were made by this task, arm, version, prompts and
selection (a RecordError otherwise), and RunSummary, what one run call did."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evals.engines import base
from evals.errors import EvalError, RecordError
from evals.records.samples import read_records, sha256_text
from evals.run.selection import sample_seed, select_items
from evals.tasks.base import Item, Request, Task

REQUEST_TYPES: dict[str, type] = {
    "generate": base.GenerateRequest,
    "loglikelihood": base.LoglikelihoodRequest,
    "token_logprobs": base.TokenLogprobsRequest,
}
RESUME_RECORDS_HINT = "write this run into a new output folder (or delete the old records)"


@dataclass(frozen=True)
class RunSummary:
    """What one `run_task` call did."""

    task: str
    arm: str
    path: Path
    items: int  # items selected (after `limit`)
    samples: int  # items x repeats
    skipped: int  # samples already on disk before this call (resume)
    written: int  # samples written by this call
    errors: int  # of those, samples recorded with an error
    seconds: float  # wall time of this call
    output_tokens: int = 0  # generated tokens of the samples written (generation tasks)

    @property
    def samples_per_second(self) -> float:
        """Samples written per second of wall time (0 when nothing ran)."""
        return self.written / self.seconds if self.seconds > 0 and self.written else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of wall time (0 for tasks that generate nothing)."""
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Sample:
    """One (item, repeat) of a selection: its seed, request and prompt hash, or why no request was built."""

    item: Item
    repeat: int
    seed: int
    request: Request | None
    prompt_hash: str
    error: str | None  # building the request failed


def build_samples(task: Task, items: Sequence[Item], repeats: int, seed: int) -> list[Sample]:
    """Every (item, repeat) of the selection with its request and prompt hash, item-major."""
    want = REQUEST_TYPES[task.kind]
    samples: list[Sample] = []
    for item in items:
        for repeat in range(repeats):
            s = sample_seed(seed, task.name, item.item_id, repeat)
            try:
                req = task.request(item, repeat=repeat, seed=s)
                if not isinstance(req, want):
                    raise TypeError(f"task {task.name!r} of kind {task.kind!r} built a {type(req).__name__}")
                samples.append(Sample(item, repeat, s, req, sha256_text(task.prompt_text(req)), None))
            except EvalError:
                raise
            except Exception as exc:  # noqa: BLE001 - recorded as this sample's error
                samples.append(Sample(item, repeat, s, None, sha256_text(""), f"request: {type(exc).__name__}: {exc}"))
    return samples


def check_existing(path: Path, task: Task, arm: str, samples: Sequence[Sample],
                   hint: str = RESUME_RECORDS_HINT) -> None:
    """Refuse to resume into records made by another task, arm, version, prompt or selection."""
    existing = read_records(path)
    if not existing:
        return
    by_key = {(s.item.item_id, s.repeat): s for s in samples}
    for rec in existing:
        if rec.task != task.name or rec.arm != arm:
            raise RecordError(f"{path}: holds records of task {rec.task!r} arm {rec.arm!r}, not {task.name!r} "
                              f"arm {arm!r}; {hint}")
        if rec.task_version != task.version:
            raise RecordError(f"{path}: records are from {task.name} version {rec.task_version}, this is "
                              f"{task.version}; {hint}")
        sample = by_key.get(rec.key)
        if sample is None:
            raise RecordError(f"{path}: item {rec.item_id!r} repeat {rec.repeat} is on disk but not in this run's "
                              f"selection (limit, repeats or seed changed?); {hint}")
        if rec.prompt_hash != sample.prompt_hash and sample.error is None:
            raise RecordError(f"{path}: item {rec.item_id!r} was run with a different prompt (task options "
                              f"changed?); {hint}")


def missing_samples(task: Task, *, arm: str, path: Path, limit: int | None = None, repeats: int = 1, seed: int = 0,
                    data_dir: Path | None = None, hint: str = RESUME_RECORDS_HINT) -> int:
    """Check the records in `path` against this selection and its recomputed prompts, as a resumed
    `run_task` does (RecordError naming the first mismatch, ending with `hint`); the samples not on disk."""
    samples = build_samples(task, select_items(task.items(data_dir), limit, seed), repeats, seed)
    check_existing(path, task, arm, samples, hint)
    done = {r.key for r in read_records(path)}
    return sum((s.item.item_id, s.repeat) not in done for s in samples)
