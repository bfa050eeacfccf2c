"""Import an Inspect AI eval log (`.eval` or `.json`) as SampleRecords, read through inspect-ai's own log reader
(`inspect_ai.log.read_eval_log`; inspect-ai is an optional dependency, imported here only).

One SampleRecord per sample and epoch: item id the sample's id, repeat its epoch - 1, task the log's task,
task version the log's; scores keyed "<scorer>,none" with each scorer's value as inspect-ai turns it into a
number (`inspect_ai.scorer.value_to_float`: "C" 1, "I" 0, "P" 0.5, "N" 0, booleans and numbers as they are),
a dict-valued score as "<scorer>_<key>,none" per key. The prompt hash is the hash of the sample's input (its
messages' roles and text), so two logs whose samples share an id but not an input are refused when they are
paired (qa.compare), as are logs whose sets of (id, epoch) differ. A sample that errored is recorded with its
error and no scores. The input text itself is not kept (only its hash), as with lm-eval imports.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evals.errors import RecordError, one_line
from evals.records.samples import SampleRecord, sha256_text

INSPECT_SUFFIXES = (".eval", ".json")
INSTALL_HINT = "pip install 'inspect-ai==0.3.285' (the dev extra has it)"


def is_inspect_log(path: Path) -> bool:
    """True for a file named like an Inspect AI log (.eval or .json)."""
    return path.is_file() and path.suffix in INSPECT_SUFFIXES


def _input_text(value: Any) -> str:
    """A sample's input as one canonical string: the text, or each message's role and text."""
    if isinstance(value, str):
        return value
    return json.dumps([[m.role, m.text] for m in value], ensure_ascii=False)


def _scores(sample: Any, to_float: Any) -> dict[str, float | None]:
    """The sample's scores as numbers, keyed "<scorer>,none" (a dict value: "<scorer>_<key>,none")."""
    out: dict[str, float | None] = {}
    for name, score in (sample.scores or {}).items():
        value = score.value
        if isinstance(value, dict):
            out.update({f"{name}_{k},none": float(to_float(v)) for k, v in value.items()})
        elif isinstance(value, list):
            raise RecordError(f"scorer {name!r} of sample {sample.id!r} gave a list; give one value or a dict")
        else:
            out[f"{name},none"] = float(to_float(value))
    return out


def import_inspect(path: Path, arm: str) -> list[SampleRecord]:
    """Every sample x epoch of the Inspect AI log at `path` as a SampleRecord of `arm` (module doc)."""
    try:
        from inspect_ai.log import read_eval_log  # inspect_ai: optional, only to read an Inspect AI log
        from inspect_ai.scorer import value_to_float  # inspect_ai: its own score-to-number rule
    except ImportError:
        raise RecordError(f"{path}: reading an Inspect AI log needs inspect-ai: {INSTALL_HINT}") from None
    try:
        log = read_eval_log(str(path))
    except Exception as exc:  # noqa: BLE001 - whatever the reader says, the file is not a log it reads
        raise RecordError(f"{path}: not an Inspect AI log inspect-ai can read: {one_line(exc)[:300]}") from None
    if not log.samples:
        raise RecordError(f"{path}: an Inspect AI log with no samples (status {log.status}); run the eval with its "
                          "samples logged")
    to_float = value_to_float()
    records = []
    for s in log.samples:
        error = f"inspect: {' '.join(s.error.message.split())}" if s.error is not None else None
        target = s.target if isinstance(s.target, str) else json.dumps(s.target)
        records.append(SampleRecord(
            task=log.eval.task, task_version=str(log.eval.task_version), arm=arm, item_id=str(s.id),
            repeat=s.epoch - 1, prompt_hash=sha256_text(_input_text(s.input)), target_hash=sha256_text(target),
            completion=s.output.completion if s.output is not None else None,
            scores={} if error else _scores(s, to_float), error=error,
            meta={"inspect_model": log.eval.model, "inspect_log": path.name}))
    return records
