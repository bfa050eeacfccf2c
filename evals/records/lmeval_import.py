"""Import lm-eval `--output_path ... --log_samples` folders (any backend) as SampleRecords.

lm-eval writes `<output_path>/<model>/results_<date>.json` and, per task,
`samples_<task>_<date>.jsonl` with one line per (doc, filter): doc_id, doc, target, arguments,
resps, filtered_resps, filter, metrics, doc_hash, prompt_hash, target_hash and the metric values
(lm_eval/evaluator.py, loggers/evaluation_tracker.py, v0.4.x). `resps` and `filtered_resps` are
stringified by lm-eval (`sanitize_list`), so log-likelihoods arrive as "-1.25" and "True".

One SampleRecord per doc (repeat 0: lm-eval reduces its repeats per doc through the filter):
scores keyed "metric,filter" for every scalar per-doc metric, extracted answers per filter,
the first raw completion, and per-choice log-likelihoods for log-likelihood tasks. The document
text itself is never kept (only its hash), so imports cannot leak protected data.

A per-doc metric that is NaN or infinite (lm-eval writes them as NaN / Infinity) makes that doc an
errored sample: error "non-finite score ... (<file>:<line>)", no scores, and a logged warning. It
then counts against the policy's error budget like any failed sample, rather than stopping the
import of a log the user cannot fix.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.errors import RecordError
from evals.records.samples import SampleRecord, first_non_finite, sha256_text
from quant.fileio import jsonl_objects

log = logging.getLogger(__name__)

SAMPLES_RE = re.compile(r"^samples_(?P<task>.+)_(?P<date>\d{4}-\d{2}-\d{2}T[0-9.\-]+)\.jsonl$")
RESULTS_RE = re.compile(r"^results_(?P<date>\d{4}-\d{2}-\d{2}T[0-9.\-]+)\.json$")


@dataclass(frozen=True)
class SamplesFile:
    """One lm-eval per-task samples file and the run date in its name."""

    task: str
    date: str
    path: Path


def find_samples_files(folder: Path) -> list[SamplesFile]:
    """Every `samples_<task>_<date>.jsonl` under `folder` (any depth), sorted by task then date."""
    found = []
    for p in folder.rglob("samples_*.jsonl"):
        m = SAMPLES_RE.match(p.name)
        if m:
            found.append(SamplesFile(m["task"], m["date"], p))
    return sorted(found, key=lambda f: (f.task, f.date))


def is_lmeval_folder(folder: Path) -> bool:
    """True when `folder` holds lm-eval samples files (written with --log_samples)."""
    return folder.is_dir() and bool(find_samples_files(folder))


def _latest_per_task(files: list[SamplesFile]) -> list[SamplesFile]:
    by_task: dict[str, list[SamplesFile]] = {}
    for f in files:
        by_task.setdefault(f.task, []).append(f)
    chosen = []
    for task, fs in sorted(by_task.items()):
        parents = sorted({str(f.path.parent) for f in fs})
        if len(parents) > 1:
            raise RecordError(
                f"task {task}: samples in {len(parents)} model folders ({', '.join(parents[:2])}); "
                "point at one model's folder"
            )
        if len(fs) > 1:
            log.warning("task %s: %d lm-eval runs in %s; using the latest (%s)", task, len(fs), parents[0], fs[-1].date)
        chosen.append(fs[-1])
    return chosen


def _results_for(samples: SamplesFile) -> dict[str, Any]:
    """The results_<date>.json written with the samples file (same date id), else the newest one."""
    same = samples.path.parent / f"results_{samples.date}.json"
    candidates = [same] if same.exists() else sorted(
        (p for p in samples.path.parent.glob("results_*.json") if RESULTS_RE.match(p.name)), reverse=True
    )
    for p in candidates:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise RecordError(f"{p}: unreadable lm-eval results file ({exc})") from None
        if isinstance(data, dict):
            return data
    return {}


def _float(x: Any) -> float:
    return float(x) if not isinstance(x, str) else float(x.strip())


def _bool(x: Any) -> bool:
    if isinstance(x, bool):
        return x
    return str(x).strip() == "True"


def _scalar(v: Any) -> float | None:
    """A per-doc metric value as float (NaN and inf included), or None when it is not a scalar (e.g.
    corpus-level pairs)."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        return float(v)
    return None


def _is_ll_pair(x: Any) -> bool:
    return isinstance(x, list) and len(x) == 2 and not isinstance(x[0], list)


@dataclass
class _Doc:
    """Accumulates the per-filter lines of one doc."""

    line: dict[str, Any]
    scores: dict[str, float | None]
    extracted: dict[str, str | None]
    error: str | None = None  # the first non-finite score, with its file:line


def _read_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, sample line) for every complete line; a torn last line is dropped with a warning."""
    raw = path.read_text(encoding="utf-8")
    lines = raw.split("\n")
    if lines and lines[-1].strip() and not raw.endswith("\n"):
        try:
            json.loads(lines[-1])
        except json.JSONDecodeError:
            log.warning("%s: dropping a torn last line", path)
            lines = lines[:-1]
    return list(jsonl_objects(lines, path, RecordError, corrupt="the samples file is corrupt",
                              expected="not an lm-eval sample line (needs doc_id and filter)",
                              keys=("doc_id", "filter")))


def _prompt_of(line: dict[str, Any]) -> str | None:
    args = line.get("arguments")
    if isinstance(args, dict):  # {"gen_args_0": {"arg_0": context, "arg_1": ...}, ...}
        first = args.get("gen_args_0")
        if isinstance(first, dict) and isinstance(first.get("arg_0"), str):
            return first["arg_0"]
    if isinstance(args, list) and args and isinstance(args[0], list) and args[0]:
        return str(args[0][0])
    return None


def read_samples_file(path: Path, task: str, task_version: str, arm: str) -> list[SampleRecord]:
    """SampleRecords (one per doc, every filter merged) from one lm-eval samples file."""
    docs: dict[str, _Doc] = {}
    seen: set[tuple[str, str]] = set()
    skipped: set[str] = set()
    for lineno, line in _read_lines(path):
        doc_id, filt = str(line["doc_id"]), str(line["filter"])
        if (doc_id, filt) in seen:
            raise RecordError(f"{path}: doc {doc_id} filter {filt} appears twice; the file mixes two runs")
        seen.add((doc_id, filt))
        doc = docs.setdefault(doc_id, _Doc(line=line, scores={}, extracted={}))
        for metric in line.get("metrics") or []:
            if metric not in line:
                continue
            value = _scalar(line[metric])
            if value is None:
                skipped.add(metric)
                continue
            key = f"{metric},{filt}"
            problem = first_non_finite({key: value})
            if problem is not None and doc.error is None:
                doc.error = f"{problem} ({path.name}:{lineno})"
                log.warning("%s: doc %s: %s; recorded as an errored sample", path, doc_id, doc.error)
            doc.scores[key] = value
        fr = line.get("filtered_resps") or []
        if fr and not _is_ll_pair(fr[0]):
            first = fr[0][0] if isinstance(fr[0], list) and fr[0] else fr[0]
            doc.extracted[filt] = None if first is None else str(first)
    if skipped:
        log.info("%s: per-doc metrics %s are not scalars (corpus-level); not paired", path.name, sorted(skipped))
    records = []
    for doc_id, doc in docs.items():
        line = doc.line
        resps = line.get("resps") or []
        fr = line.get("filtered_resps") or []
        completion = ll = greedy = None
        if fr and all(_is_ll_pair(x) for x in fr):  # log-likelihood requests: one [ll, is_greedy] per choice
            ll = [_float(x[0]) for x in fr]
            greedy = [_bool(x[1]) for x in fr]
        elif resps and isinstance(resps[0], list) and resps[0] and isinstance(resps[0][0], str):
            completion = resps[0][0]
        prompt = _prompt_of(line)
        prompt_hash = line.get("prompt_hash") or (sha256_text(prompt) if prompt is not None else None)
        if prompt_hash is None:
            raise RecordError(f"{path}: doc {doc_id} has neither prompt_hash nor arguments; not an lm-eval log")
        target = line.get("target")
        meta: dict[str, str | int | float | bool | None] = {"source": "lm-eval"}
        if line.get("doc_hash"):
            meta["doc_hash"] = str(line["doc_hash"])
        records.append(
            SampleRecord(
                task=task,
                task_version=task_version,
                arm=arm,
                item_id=doc_id,
                repeat=0,
                prompt_hash=str(prompt_hash),
                target=None if target is None else str(target),
                target_hash=line.get("target_hash") or (sha256_text(str(target)) if target is not None else None),
                completion=completion,
                choice_loglikelihoods=ll,
                choice_is_greedy=greedy,
                extracted={} if doc.error else doc.extracted,
                scores={} if doc.error else doc.scores,
                error=doc.error,
                meta=meta,
            )
        )
    return records


def import_lmeval(folder: Path, arm: str | None = None) -> list[SampleRecord]:
    """Every task's SampleRecords from an lm-eval --output_path folder written with --log_samples
    (the latest run per task). `arm` defaults to the folder's name."""
    if not folder.is_dir():
        raise RecordError(f"{folder}: no such folder")
    files = find_samples_files(folder)
    if not files:
        raise RecordError(f"{folder}: no lm-eval samples_*.jsonl files; run lm-eval with --log_samples --output_path")
    label = arm or folder.resolve().name
    out: list[SampleRecord] = []
    for f in _latest_per_task(files):
        versions = _results_for(f).get("versions") or {}
        version = versions.get(f.task)
        out.extend(read_samples_file(f.path, f.task, "unknown" if version is None else str(version), label))
    return out
