"""Resume without work: whether an arm's records are already complete, so `qa run` starts no worker for it.

An arm is complete when records/<arm>/arm.json holds the fingerprint this resolved arm would write (evals.run.arm:
model and its file hash, engine, engine arguments and the scales files they name, server, seed) and the same
fingerprint for every task (name, version, options, limit, repeats), and every task's records file holds
every (item, repeat) of the task's resolved selection. The records themselves were checked when they were
written (prompt hashes, selection); anything else (a missing or foreign arm.json, a missing sample) leaves the
arm to its worker, which resumes or refuses with its own one-line error.
"""

from __future__ import annotations

from evals.errors import EvalError
from evals.records.arm_file import ARM_FILE, ArmManifest
from evals.records.samples import read_records
from evals.run.arm import BuiltTask, arm_manifest
from qa.pipeline.resolved_run import ResolvedArm, ResolvedRun, ResolvedTask


def arm_matches(run: ResolvedRun, arm: ResolvedArm) -> bool:
    """True when records/<arm>/arm.json holds this arm's fingerprint and every task's (module doc)."""
    folder = run.records_of(arm)
    model = arm.engine_model  # resolved once, with the run (qa.pipeline.resolve)
    if not arm.record.runs or not (folder / ARM_FILE).is_file() or model is None:
        return False
    try:
        old = ArmManifest.load(folder / ARM_FILE)
        built: list[BuiltTask] = [(t.task, t.options, t.record.limit, t.record.repeats) for t in run.tasks]
        new = arm_manifest(run.config(arm), model, built)
    except EvalError:
        return False
    if old.fingerprint != new.fingerprint:
        return False
    return not any(name not in old.tasks or old.tasks[name].fingerprint != e.fingerprint
                   for name, e in new.tasks.items())


def on_disk(run: ResolvedRun, arm: ResolvedArm, task: ResolvedTask, ids: frozenset[str] | None = None) -> bool:
    """True when the arm's records of `task` hold every repeat of the items `ids` (None: the selection)."""
    items = [it.item_id for it in task.selection] if ids is None else sorted(ids)
    try:
        done = {r.key for r in read_records(run.records_of(arm) / f"{task.name}.jsonl")}
    except EvalError:
        return False
    return all((i, k) in done for i in items for k in range(task.repeats))


def arm_complete(run: ResolvedRun, arm: ResolvedArm) -> bool:
    """True when records/<arm>/ already holds this arm's every sample (module doc); reads files only."""
    return arm_matches(run, arm) and all(on_disk(run, arm, t) for t in run.tasks)
