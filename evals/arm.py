"""Run one arm: build its engine once, run each task into `records/<arm>/<task>.jsonl`.

Each arm folder holds `arm.json`: the arm's resolved configuration and its fingerprint (sha256 of
the canonical JSON of model, model file hash, engine, engine arguments, limit, repeats, seed) plus
one fingerprint per task (name, version, options). A rerun into the same folder resumes only when
the arm fingerprint and every already-run task's fingerprint match; otherwise it raises RecordError
naming what changed and writes nothing. New tasks may be added to an existing arm.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evals.engines import build_engine
from evals.errors import EvalError, RecordError
from evals.models import ResolvedModel, resolve_model
from evals.runner import RunSummary, run_task
from evals.tasks import get_task
from evals.tasks.base import Task, TaskOptions
from quant.fileio import atomic_write_text, sha256_file
from quant.validation import first_error

ARM_FILE = "arm.json"
ARM_SCHEMA = 1
ARM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
SCALES_KEYS = ("scales", "scales_file")  # engine arguments naming a file whose bytes are part of the config


class ArmConfig(BaseModel):
    """One arm as the spec layer resolved it: model, engine and how many samples."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    model: str
    engine: str = "hf"
    engine_args: dict[str, Any] = Field(default_factory=dict)
    limit: int | None = Field(default=None, ge=1)
    repeats: int = Field(default=1, ge=1)
    seed: int = 0
    data_dir: Path | None = None  # where the data is read from: a location, not part of the fingerprint
    # A server started for this arm (`qa run`): its settings identify the arm; its base_url (a free port
    # chosen at each start) does not.
    server: dict[str, Any] | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not ARM_NAME_RE.match(name):
            raise ValueError(f"arm name {name!r} must be letters, digits, '_', '.', '-' (it names a folder)")
        return name


@dataclass(frozen=True)
class TaskSpec:
    """A task by registry name with its options."""

    name: str
    options: TaskOptions = field(default_factory=TaskOptions)
    limit: int | None = None  # None: the arm's limit
    repeats: int | None = None  # None: the arm's repeats


def parse_arm(data: Mapping[str, Any]) -> ArmConfig:
    """Validate a plain mapping into an ArmConfig; a bad key or value is a one-line EvalError."""
    try:
        return ArmConfig.model_validate(dict(data))
    except ValidationError as exc:
        err = first_error(exc)
        raise EvalError(f"arm config: {err.where_or('arm')}: {err.msg}") from None


def _plain(value: Any) -> Any:
    """A JSON-able, canonical form of a config value (paths as strings, tuples as lists)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def _file_hashes(args: Mapping[str, Any]) -> dict[str, str]:
    """sha256 of every file named by a scales argument (nested in `kv` too): new scales, new config."""
    from quant.scales import scales_paths

    found: dict[str, str] = {}

    def visit(prefix: str, obj: Any) -> None:
        if isinstance(obj, Mapping):
            for k, v in obj.items():
                if k in SCALES_KEYS and isinstance(v, str | Path) and v:
                    for p in scales_paths(Path(v)):
                        if p.is_file():
                            found[f"{prefix}{k}:{p.name}"] = sha256_file(p)
                else:
                    visit(f"{prefix}{k}.", v)

    visit("", args)
    return found


def _scales_by_name(args: Mapping[str, Any]) -> Any:
    """`args` with every scales file named by its file name only: its bytes are fingerprinted by
    `_file_hashes`, so a run folder that moves (or a relative path read from another directory)
    still resumes, while new scale values still make a new configuration."""

    def visit(obj: Any) -> Any:
        if isinstance(obj, Mapping):
            return {
                k: Path(v).name if k in SCALES_KEYS and isinstance(v, str | Path) and v else visit(v)
                for k, v in obj.items()
            }
        return obj

    return visit(args)


def _without_started_url(config: ArmConfig) -> Mapping[str, Any]:
    """Engine arguments without the base_url of a server started for this arm (a new port each start)."""
    if config.server is None:
        return config.engine_args
    return {k: v for k, v in config.engine_args.items() if k != "base_url"}


def task_fingerprint(task: Task, options: TaskOptions | None, limit: int | None = None,
                     repeats: int | None = None) -> dict[str, Any]:
    """What identifies a task's configuration: name, version and options (or its dataclass fields),
    and its own limit / repeats when they override the arm's."""
    detail = _plain(options) if options is not None else _plain(task)
    fp: dict[str, Any] = {"name": task.name, "version": task.version, "config": detail}
    if limit is not None:
        fp["limit"] = limit
    if repeats is not None:
        fp["repeats"] = repeats
    return fp


def arm_manifest(config: ArmConfig, model: ResolvedModel, tasks: Sequence[tuple[Any, ...]]) -> dict:
    """The arm.json content for this configuration (without tasks already in an older manifest)."""
    resolved = {
        "name": config.name,
        "model": config.model,
        "model_file_hash": model.file_hash,
        "engine": config.engine,
        "engine_args": _plain(_scales_by_name(_without_started_url(config))),
        "engine_files": _file_hashes(config.engine_args),
        "limit": config.limit,
        "repeats": config.repeats,
        "seed": config.seed,
    }
    if config.server is not None:
        resolved["server"] = _plain(config.server)
    task_entries = {}
    for task, options, *counts in tasks:
        fp = task_fingerprint(task, options, *counts)
        task_entries[task.name] = {**fp, "fingerprint": _digest(fp)}
    return {"schema_version": ARM_SCHEMA, "config": resolved, "fingerprint": _digest(resolved), "tasks": task_entries}


def _diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys[:4]) or "fingerprint"


def check_arm_folder(arm_dir: Path, manifest: dict) -> dict:
    """The manifest to write: the old one plus new tasks. RecordError when the folder holds records of
    another configuration (arm settings or an already-run task changed), or records without arm.json."""
    path = arm_dir / ARM_FILE
    hint = "use a new output folder, or delete it to start over"
    if not path.exists():
        stray = sorted(p.name for p in arm_dir.glob("*.jsonl")) if arm_dir.is_dir() else []
        if stray:
            raise RecordError(f"{arm_dir}: holds records ({', '.join(stray[:3])}) but no {ARM_FILE}; {hint}")
        return manifest
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        old_fp, old_cfg, old_tasks = old["fingerprint"], old["config"], old["tasks"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise RecordError(f"{path}: not a valid arm manifest; {hint}") from None
    if old.get("schema_version") != ARM_SCHEMA:
        raise RecordError(f"{path}: manifest schema {old.get('schema_version')!r}, this toolkit writes {ARM_SCHEMA}; {hint}")
    if old_fp != manifest["fingerprint"]:
        raise RecordError(f"{arm_dir}: arm {manifest['config']['name']!r} was run with another configuration "
                          f"({_diff(old_cfg, manifest['config'])}); {hint}")
    merged = dict(old_tasks)
    for name, entry in manifest["tasks"].items():
        prev = old_tasks.get(name)
        if prev is not None and prev.get("fingerprint") != entry["fingerprint"]:
            raise RecordError(f"{arm_dir}: task {name!r} was run with other options "
                              f"({_diff(prev.get('config') or {}, entry['config'])}); {hint}")
        merged[name] = entry
    return {**old, "tasks": merged}


def run_arm(config: ArmConfig, tasks: Sequence[TaskSpec | Task], out_dir: Path, *,
            progress: bool = True) -> list[RunSummary]:
    """Run every task for one arm into `out_dir/records/<arm>/` (out_dir is the run directory)."""
    if not tasks:
        raise EvalError("no tasks to run; name at least one task")
    built: list[tuple[Task, TaskOptions | None, int | None, int | None]] = [
        (get_task(t.name, t.options), t.options, t.limit, t.repeats) if isinstance(t, TaskSpec)
        else (t, None, None, None) for t in tasks
    ]
    names = [t.name for t, *_ in built]
    if len(set(names)) != len(names):
        raise EvalError(f"task list names a task twice: {names}")
    model = resolve_model(config.model)
    arm_dir = Path(out_dir) / "records" / config.name
    manifest = check_arm_folder(arm_dir, arm_manifest(config, model, built))
    # built before anything is written: engine arguments it refuses leave no folder behind that
    # would make the corrected command look like "another configuration"
    engine = build_engine(config.engine, model, config.engine_args)
    # What the engine says of itself (not part of the fingerprint): the report warns when it is not
    # bit-reproducible, since then a rerun of the same arm may itself flip answers.
    manifest = {**manifest, "engine_info": {"name": engine.info.name, "deterministic": engine.info.deterministic}}
    arm_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(arm_dir / ARM_FILE, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    summaries: list[RunSummary] = []
    try:
        for task, _, limit, repeats in built:
            summaries.append(run_task(engine, task, arm=config.name, out_path=arm_dir / f"{task.name}.jsonl",
                                      limit=config.limit if limit is None else limit,
                                      repeats=repeats or config.repeats, seed=config.seed,
                                      data_dir=config.data_dir, progress=progress))
    finally:
        engine.close()
    return summaries
