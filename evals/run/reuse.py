"""Reuse an earlier run's records of one arm (a baseline that has not changed since the last release).

`reuse_arm` takes `<source>/records/<arm>/` into `<out>/records/<arm>/` only when the earlier arm is this
arm: same arm identity (model and model file hash, engine, engine arguments and the files they name,
server, seed, limit, repeats: everything arm.json fingerprints, checked key by key), and per task the
same version, item selection, recomputed prompt hashes (`evals.run.resume.missing_samples`) and options,
with every sample of the selection on disk. Otherwise it raises RecordError naming the first mismatch
and writes nothing. Records are copied byte for byte; arm.json is written last and records the source
directory and its fingerprint (`ReusedFrom`), so a killed copy is simply redone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import JsonValue

from evals.errors import RecordError
from evals.models.resolve import resolve_model
from evals.records.arm_file import ARM_FILE, ArmManifest, ReusedFrom
from evals.run.arm import ArmConfig, ArmTask, arm_manifest
from evals.run.resume import missing_samples
from evals.tasks import get_task
from quant.fileio import atomic_write_bytes


def _first_difference(what: str, old: Mapping[str, JsonValue], new: Mapping[str, JsonValue],
                      order: Sequence[str]) -> str | None:
    keys = [k for k in order if k in old or k in new] + sorted(set(old) | set(new) - set(order))
    for key in keys:
        if old.get(key) != new.get(key):
            return f"{what}{key}: earlier run {old.get(key)!r}, this run {new.get(key)!r}"
    return None


def check_reuse(config: ArmConfig, tasks: Sequence[ArmTask], source_dir: Path) -> ArmManifest:
    """The manifest a reuse of arm `config.name`'s records of `tasks` from the run `source_dir` would
    write, when they are this arm's (see the module doc); writes nothing. RecordError: the first mismatch."""
    src = Path(source_dir) / "records" / config.name
    where = f"{config.name}.from = {str(source_dir)!r}"
    if not (src / ARM_FILE).is_file():
        raise RecordError(f"{where}: no {src / ARM_FILE} (not a run directory with a {config.name!r} arm)")
    old = ArmManifest.load(src / ARM_FILE)
    built = [(get_task(t.name, t.options, config.model), t.options, t.limit, t.repeats) for t in tasks]
    new = arm_manifest(config, resolve_model(config.model), built)
    order = [k for k in type(new.config).model_fields if k != "name"]
    problem = _first_difference("", old.config.canonical(), new.config.canonical(), order)
    if problem is not None:
        raise RecordError(f"{where}: cannot reuse: {problem}")
    hint = "run the baseline again (remove `from`), or point `from` at a matching run"
    for task, options, limit, repeats in built:
        entry, prev = new.tasks[task.name], old.tasks.get(task.name)
        if prev is None:
            raise RecordError(f"{where}: cannot reuse: task {task.name!r} is not in the earlier run")
        ident = {k: v for k, v in entry.identity().items() if k != "config"}
        problem = _first_difference(f"task {task.name!r} ", {k: v for k, v in prev.identity().items()
                                                             if k != "config"}, ident, list(ident))
        if problem is not None:
            raise RecordError(f"{where}: cannot reuse: {problem}")
        try:  # the prompts this run would send, recomputed, against the earlier run's prompt hashes
            missing = missing_samples(task, arm=config.name, path=src / f"{task.name}.jsonl",
                                      limit=config.limit if limit is None else limit,
                                      repeats=repeats or config.repeats, seed=config.seed,
                                      data_dir=config.data_dir, hint=hint)
        except RecordError as exc:
            raise RecordError(f"{where}: cannot reuse: {exc}") from None
        before, after = prev.config, entry.config
        if before != after:
            problem = (_first_difference(f"task {task.name!r} option ", before, after, [])
                       if isinstance(before, dict) and isinstance(after, dict) else None)
            raise RecordError(f"{where}: cannot reuse: {problem or f'task {task.name!r} options differ'}")
        if missing:
            raise RecordError(f"{where}: cannot reuse: task {task.name!r} has {missing} sample(s) of this "
                              "selection missing in the earlier run (it did not finish)")
    return new.model_copy(update={
        "engine_info": old.engine_info,
        "reused_from": ReusedFrom(run_dir=str(Path(source_dir).resolve()), fingerprint=old.fingerprint)})


def copy_reused(manifest: ArmManifest, out_dir: Path) -> None:
    """Copy the checked records (`check_reuse`'s manifest) byte for byte into `out_dir`/records/<arm>/,
    then write its arm.json (last, so a killed copy has no manifest and is simply redone)."""
    assert manifest.reused_from is not None  # a manifest from check_reuse
    src = Path(manifest.reused_from.run_dir) / "records" / manifest.config.name
    arm_dir = Path(out_dir) / "records" / manifest.config.name
    for name in manifest.tasks:
        atomic_write_bytes(arm_dir / f"{name}.jsonl", (src / f"{name}.jsonl").read_bytes())
    manifest.save(arm_dir / ARM_FILE)


def reuse_arm(config: ArmConfig, tasks: Sequence[ArmTask], out_dir: Path, source_dir: Path) -> ArmManifest:
    """`check_reuse`, then `copy_reused` into the run `out_dir`; the manifest written."""
    manifest = check_reuse(config, tasks, source_dir)
    copy_reused(manifest, out_dir)
    return manifest
