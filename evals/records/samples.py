"""Per-sample records: the versioned schema and the crash-safe JSONL writer and reader.

One `SampleRecord` per (task, item, repeat) is appended to `records/<arm>/<task>.jsonl` and
flushed (and fsync'ed) as soon as the sample finishes, so a killed run loses at most the sample in
flight. On resume, a torn last line (a write cut by a kill) is detected, dropped with a warning
and truncated away; every complete line is kept and its (item id, repeat) is skipped.

Scores are finite or None. A task score that is NaN or infinite makes its sample an errored one
(`first_non_finite` names it; the runner records that error with no scores), and a records
file holding a non-finite score is refused with a RecordError naming its file and line.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evals.engines.base import TokenLogprobs
from evals.errors import RecordError
from quant.fileio import atomic_write_text, jsonl_objects
from quant.validation import first_error

SCHEMA_VERSION = 1
log = logging.getLogger(__name__)


def sha256_text(text: str) -> str:
    """Hex sha256 of a UTF-8 string (prompt and target hashes, as lm-eval logs them)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def first_non_finite(scores: Mapping[str, float | None]) -> str | None:
    """The message "non-finite score <value> for '<key>'" for the first NaN/inf score, else None."""
    for key, value in scores.items():
        if value is not None and not math.isfinite(value):
            return f"non-finite score {value} for {key!r}"
    return None


class SampleRecord(BaseModel):
    """One finished sample of one arm. `scores` keys are "metric,filter" as in lm-eval
    ("acc,none", "exact_match,strict-match"); a failed sample has `error` set and every score None.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    task: str
    task_version: str
    arm: str
    item_id: str
    repeat: int = Field(default=0, ge=0)
    cluster: str | None = None
    prompt_hash: str
    target: str | None = None
    target_hash: str | None = None
    completion: str | None = None  # the generation's final answer (what was scored); its reasoning is `reasoning`
    choice_loglikelihoods: list[float] | None = None
    choice_is_greedy: list[bool] | None = None
    extracted: dict[str, str | None] = Field(default_factory=dict)
    scores: dict[str, float | None] = Field(default_factory=dict)
    output_tokens: int | None = None
    finish_reason: str | None = None
    reasoning: str | None = None  # the reasoning part of a generation (think tags / reasoning_content), not scored
    truncated: bool | None = None  # generation hit max_tokens before its final answer (None: not a generation)
    error: str | None = None
    token_logprobs: TokenLogprobs | None = None
    # teacher-forced distribution over the item's reference continuation given its prompt (a reference
    # answer, a session's fixed continuation): the paired signal where accuracy carries no information
    reference_logprobs: TokenLogprobs | None = None
    meta: dict[str, str | int | float | bool | None] = Field(default_factory=dict)

    @field_validator("scores")
    @classmethod
    def _scores_are_finite(cls, scores: dict[str, float | None]) -> dict[str, float | None]:
        problem = first_non_finite(scores)
        if problem is not None:
            raise ValueError(f"{problem}; a NaN or infinite score must be recorded as an error (score None)")
        return scores

    @property
    def key(self) -> tuple[str, int]:
        """(item id, repeat): what identifies a sample within one task of one arm."""
        return (self.item_id, self.repeat)


def _record(data: dict[str, object], path: Path, lineno: int) -> SampleRecord:
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RecordError(
            f"{path}:{lineno}: record schema_version {version!r}, this toolkit reads {SCHEMA_VERSION}; "
            "re-run the arm into a new folder"
        )
    try:
        return SampleRecord.model_validate(data)
    except ValidationError as exc:
        err = first_error(exc)
        raise RecordError(f"{path}:{lineno}: invalid record ({err.where}: {err.msg})") from None


def read_records(path: Path, *, repair: bool = False) -> list[SampleRecord]:
    """Every complete record of a JSONL file. A torn last line (no trailing newline, left by a
    kill mid-write) is dropped with a warning and, with `repair`, truncated from the file.
    A corrupt line anywhere else is a RecordError: that is not a crash artefact."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    complete, _, tail = raw.rpartition(b"\n")
    if tail:
        log.warning("%s: dropping a torn last line (%d bytes) left by an interrupted write", path, len(tail))
        if repair:
            with open(path, "r+b") as fh:
                fh.truncate(len(complete) + 1 if complete or raw.startswith(b"\n") else 0)
                fh.flush()
                os.fsync(fh.fileno())
    body = complete.decode("utf-8", errors="replace") if complete or raw.startswith(b"\n") else ""
    objects = jsonl_objects(body.split("\n"), path, RecordError, corrupt="the file is corrupt",
                            expected="expected a JSON object per line")
    return [_record(data, path, lineno) for lineno, data in objects]


class RecordWriter:
    """Appends records to one JSONL file, one line per record, flushed and fsync'ed per record.
    Refuses duplicates of (item id, repeat) already present in the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._done: set[tuple[str, int]] = {r.key for r in read_records(path, repair=True)}
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open until close() / __exit__

    @property
    def done(self) -> frozenset[tuple[str, int]]:
        """Keys (item id, repeat) already written: a resumed run skips these."""
        return frozenset(self._done)

    def write(self, record: SampleRecord) -> None:
        """Append one record durably; a key written before is an internal error."""
        if record.key in self._done:
            raise RecordError(f"{self.path}: duplicate record for item {record.item_id!r} repeat {record.repeat}")
        line = record.model_dump_json(exclude_none=False) + "\n"
        self._fh.write(line)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._done.add(record.key)

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_arm_records(arm_dir: Path) -> Iterator[SampleRecord]:
    """All records of one arm folder (`records/<arm>/*.jsonl`), file by file in name order."""
    if not arm_dir.is_dir():
        raise RecordError(f"{arm_dir}: no such records folder")
    for path in sorted(arm_dir.glob("*.jsonl")):
        yield from read_records(path)


def write_records(path: Path, records: Iterable[SampleRecord]) -> None:
    """Write a whole records file at once (imports, tests); atomic: temp file, fsync, rename."""
    atomic_write_text(path, "".join(r.model_dump_json() + "\n" for r in records))
