"""Analyze two arms: read them (toolkit record folders, lm-eval --log_samples folders or Inspect AI logs), pair them,
and compute every estimate, distribution statistic and truncation / output-length estimate (a
`Comparison`: numbers, no decisions)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from evals.errors import RecordError
from evals.records.inspect_import import import_inspect, is_inspect_log
from evals.records.lmeval_import import import_lmeval, is_lmeval_folder
from evals.records.samples import SampleRecord, iter_arm_records
from qa.compare.cache_path import cache_path_estimates, standard_records
from qa.compare.distribution import distribution_estimates, has_token_logprobs
from qa.compare.estimate import adjust_multiplicity, estimate, excess_flips
from qa.compare.generation import generation_estimate
from qa.compare.pairing import pair_records, paired_metric, score_keys
from qa.compare.reference import reference_estimate
from qa.compare.slices import slice_tables
from qa.files.comparison import Comparison, Estimate, StatsSettings

ArmFormat = Literal["records", "lm-eval", "inspect"]
Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class Arm:
    """One arm's records and where they came from."""

    label: str
    format: ArmFormat
    records: tuple[SampleRecord, ...]


def detect_format(path: Path) -> ArmFormat:
    """"records" for a toolkit arm folder (<task>.jsonl records), "lm-eval" for a --log_samples folder,
    "inspect" for an Inspect AI log file (.eval / .json)."""
    if is_inspect_log(path):
        return "inspect"
    if not path.is_dir():
        raise RecordError(f"{path}: no such folder; pass an arm records folder, an lm-eval --output_path folder "
                          "or an Inspect AI log (.eval / .json)")
    if any(p.name.startswith("samples_") for p in path.glob("*.jsonl")) or (
        not any(path.glob("*.jsonl")) and is_lmeval_folder(path)
    ):
        return "lm-eval"
    if any(path.glob("*.jsonl")):
        return "records"
    raise RecordError(
        f"{path}: neither records (<task>.jsonl) nor lm-eval samples (samples_*.jsonl); "
        "pass records/<arm> of a run or an lm-eval --output_path written with --log_samples"
    )


def load_arm(path: Path) -> Arm:
    """Every record of one arm, whatever its format; the label is the records' arm name or the folder name."""
    fmt = detect_format(path)
    if fmt == "inspect":
        return Arm(label=path.stem, format=fmt, records=tuple(import_inspect(path, path.stem)))
    if fmt == "lm-eval":
        records = import_lmeval(path)
        return Arm(label=path.resolve().name, format=fmt, records=tuple(records))
    records = list(iter_arm_records(path))
    arms = sorted({r.arm for r in records})
    if len(arms) > 1:
        raise RecordError(f"{path}: records of {len(arms)} arms ({', '.join(arms[:3])}) in one folder; keep one arm per folder")
    return Arm(label=arms[0] if arms else path.resolve().name, format=fmt, records=tuple(records))


def check_formats(paths: list[Path]) -> None:
    """RecordError when Inspect AI logs are paired with folders (their tasks and ids cannot match)."""
    logs = [is_inspect_log(p) for p in paths]
    if any(logs) and not all(logs):
        folders = ", ".join(str(p) for p, is_log in zip(paths, logs, strict=True) if not is_log)
        raise RecordError(f"Inspect AI logs pair only with Inspect AI logs (.eval or .json); not a log: {folders}")


def compare_arms(
    baseline: Arm, candidate: Arm, settings: StatsSettings, progress: Progress | None = None, rerun: Arm | None = None
) -> Comparison:
    """Pair two loaded arms (and an optional baseline rerun: noise floors) and compute the
    comparison (no files touched)."""
    # a sessions task's warm and shuffled records serve the same turns again: the per-task estimates use
    # its cold path only; cache_path_estimates compares the paths
    base_std, cand_std = standard_records(baseline.records), standard_records(candidate.records)
    tasks = pair_records(base_std, cand_std)
    reruns = {pt.task: pt for pt in pair_records(base_std, standard_records(rerun.records))} if rerun is not None else {}
    work = [(pt, key) for pt in tasks for key in score_keys(pt)]
    dist_tasks = [pt for pt in tasks if has_token_logprobs(pt)]
    total = len(work) + len(dist_tasks)
    estimates: list[Estimate] = []
    done = 0
    for pt, key in work:
        if progress:
            progress(f"{pt.task} {key}", done, total)
        est = estimate(paired_metric(pt, key), settings)
        if pt.task in reruns:
            est = est.model_copy(update={"excess_flips": excess_flips(pt, reruns[pt.task], key)})
        estimates.append(est)
        done += 1
    distribution = []
    for pt in dist_tasks:
        if progress:
            progress(f"{pt.task} distribution", done, total)
        dists = distribution_estimates(pt)
        if pt.task in reruns:
            floors = {d.metric: d.value for d in distribution_estimates(reruns[pt.task])}
            dists = [d.model_copy(update={"floor_value": floors.get(d.metric)}) for d in dists]
        distribution.extend(dists)
        done += 1
    generation = [g for g in (generation_estimate(pt, settings) for pt in tasks) if g is not None]
    if progress:
        progress("done", done, total)
    notes = []
    empty = [pt.task for pt in tasks if not score_keys(pt) and not has_token_logprobs(pt)]
    if empty:
        notes.append(f"tasks without per-sample scalar scores or token log-probs (not compared): {', '.join(empty)}")
    return Comparison(
        baseline=baseline.label,
        candidate=candidate.label,
        rerun=rerun.label if rerun is not None else None,
        settings=settings,
        estimates=adjust_multiplicity(estimates),
        distribution=distribution,
        generation=generation,
        reference=[r for r in (reference_estimate(pt, reruns.get(pt.task)) for pt in tasks) if r is not None],
        cache_path=cache_path_estimates(baseline.records, candidate.records, settings),
        slices=slice_tables(baseline.records, (candidate.label, candidate.records),
                            (rerun.label, rerun.records) if rerun is not None else None),
        notes=notes,
    )
