"""Run one arm: build its engine once, run each task into `records/<arm>/<task>.jsonl`.

Each arm folder holds `arm.json` (evals.records.arm_file.ArmManifest): the arm's resolved configuration and
its fingerprint plus one fingerprint per task, made here from the arm's ArmConfig (`arm_manifest`). A
rerun into the same folder resumes only when the arm fingerprint and every already-run task's
fingerprint match; otherwise it raises RecordError naming what changed and writes nothing. New tasks
may be added to an existing arm.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from evals.engines import EngineName, args_model, build_engine, parse_engine_args
from evals.engines.args import EngineArgs
from evals.engines.base import Engine
from evals.engines.kv_provenance import engine_provenance
from evals.errors import EvalError, RecordError
from evals.models.resolve import ResolvedModel, resolve_model
from evals.provenance.server_log import server_log_path
from evals.records.arm_file import ARM_FILE, RESUME_HINT, ArmIdentity, ArmManifest, EngineSummary, TaskEntry
from evals.records.env import redact_env
from evals.records.fingerprint import (
    canonical_json,
    digest,
    options_identity,
    scales_by_name,
    scales_file_hashes,
)
from evals.run.resume import RunSummary
from evals.run.runner import run_task
from evals.tasks import get_task
from evals.tasks.base import Task, TaskOptions
from quant.validation import first_error

ARM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ArmConfig(BaseModel):
    """One arm as the spec layer resolved it: model, engine with its typed arguments, how many samples.
    `engine_args` given as a mapping is parsed for `engine` (parse_engine_args) when the config is made."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    model: str
    engine: EngineName = "hf"
    engine_args: EngineArgs
    limit: int | None = Field(default=None, ge=1)
    repeats: int = Field(default=1, ge=1)
    seed: int = 0
    data_dir: Path | None = None  # where the data is read from: a location, not part of the fingerprint
    # A server started for this arm (`qa run`): its settings identify the arm; its base_url (a free port
    # chosen at each start) does not.
    server: dict[str, JsonValue] | None = None
    env: dict[str, str] = Field(default_factory=dict)  # the arm's own variables (`qa run` sets them for it)

    @model_validator(mode="before")
    @classmethod
    def _parse_engine_args(cls, data: object) -> object:
        if isinstance(data, Mapping):
            args = data.get("engine_args", {})
            if isinstance(args, Mapping):
                return {**data, "engine_args": parse_engine_args(str(data.get("engine", "hf")), args)}
        return data

    @model_validator(mode="after")
    def _args_fit_the_engine(self) -> Self:
        want = args_model(self.engine)
        if not isinstance(self.engine_args, want):
            raise ValueError(  # noqa: TRY004 - pydantic reports a ValueError as a ValidationError
                f"engine {self.engine!r} takes {want.__name__}, not {type(self.engine_args).__name__}")
        return self

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not ARM_NAME_RE.match(name):
            raise ValueError(f"arm name {name!r} must be letters, digits, '_', '.', '-' (it names a folder)")
        return name


@dataclass(frozen=True)
class ArmTask:
    """A task of an arm, by registry name, with its options."""

    name: str
    options: TaskOptions = field(default_factory=TaskOptions)
    limit: int | None = None  # None: the arm's limit
    repeats: int | None = None  # None: the arm's repeats


# A task ready to run: the task, the options it was made from (None: a task object given as is),
# and its own limit and repeats (None: the arm's).
BuiltTask = tuple[Task, TaskOptions | None, int | None, int | None]


def parse_arm(data: Mapping[str, object]) -> ArmConfig:
    """Validate a plain mapping into an ArmConfig; a bad key or value is a one-line EvalError."""
    try:
        return ArmConfig.model_validate(dict(data))
    except ValidationError as exc:
        err = first_error(exc)
        raise EvalError(f"arm config: {err.where_or('arm')}: {err.msg}") from None


def given_engine_args(config: ArmConfig) -> dict[str, JsonValue]:
    """The engine arguments the spec set (defaults left out), as canonical JSON; without the base_url
    of a server started for this arm (a new port each start)."""
    given = canonical_json(config.engine_args.model_dump(exclude_unset=True))
    assert isinstance(given, dict)  # a model dumps to a mapping
    if config.server is not None:
        given.pop("base_url", None)
    return given


def task_entry(task: Task, options: TaskOptions | None, limit: int | None = None,
               repeats: int | None = None) -> TaskEntry:
    """What identifies a task's configuration: name, version and options (or its dataclass fields),
    and its own limit / repeats when they override the arm's."""
    config = options_identity(options) if options is not None else canonical_json(task)
    entry = TaskEntry(name=task.name, version=task.version, config=config, limit=limit, repeats=repeats,
                      fingerprint="")
    return entry.model_copy(update={"fingerprint": digest(entry.identity())})


def arm_manifest(config: ArmConfig, model: ResolvedModel, tasks: Sequence[BuiltTask]) -> ArmManifest:
    """The manifest for this configuration (without tasks already in an older manifest)."""
    args = given_engine_args(config)
    identity = ArmIdentity(
        name=config.name, model=config.model, model_file_hash=model.file_hash, engine=config.engine,
        engine_args=scales_by_name(args),  # type: ignore[arg-type]  # a dict stays a dict
        engine_files=scales_file_hashes(args),
        limit=config.limit, repeats=config.repeats, seed=config.seed, server=config.server,
        env=redact_env(config.env),
    )
    entries = {task.name: task_entry(task, options, limit, repeats)
               for task, options, limit, repeats in tasks}
    return ArmManifest(config=identity, fingerprint=digest(identity.canonical()), tasks=entries)


def _diff(old: Mapping[str, JsonValue], new: Mapping[str, JsonValue]) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys[:4]) or "fingerprint"


def check_arm_folder(arm_dir: Path, manifest: ArmManifest) -> ArmManifest:
    """The manifest to write: the old one plus new tasks. RecordError when the folder holds records of
    another configuration (arm settings or an already-run task changed), or records without arm.json."""
    path = arm_dir / ARM_FILE
    if not path.exists():
        stray = sorted(p.name for p in arm_dir.glob("*.jsonl")) if arm_dir.is_dir() else []
        if stray:
            raise RecordError(f"{arm_dir}: holds records ({', '.join(stray[:3])}) but no {ARM_FILE}; "
                              f"{RESUME_HINT}")
        return manifest
    old = ArmManifest.load(path)
    if old.fingerprint != manifest.fingerprint:
        raise RecordError(f"{arm_dir}: arm {manifest.config.name!r} was run with another configuration "
                          f"({_diff(old.config.canonical(), manifest.config.canonical())}); {RESUME_HINT}")
    merged = dict(old.tasks)
    for name, entry in manifest.tasks.items():
        prev = old.tasks.get(name)
        if prev is not None and prev.fingerprint != entry.fingerprint:
            before = prev.config if isinstance(prev.config, dict) else {}
            after = entry.config if isinstance(entry.config, dict) else {}
            raise RecordError(f"{arm_dir}: task {name!r} was run with other options "
                              f"({_diff(before, after)}); {RESUME_HINT}")
        merged[name] = entry
    return old.model_copy(update={"tasks": merged})


@dataclass(frozen=True)
class OpenArm:
    """An arm whose engine is built and whose arm.json is written (`open_arm`): run its tasks with `run`."""

    config: ArmConfig
    engine: Engine
    arm_dir: Path
    tasks: dict[str, BuiltTask]

    def run(self, name: str, *, progress: bool = True, blocks: Sequence[int] | None = None) -> RunSummary:
        """Run task `name` into records/<arm>/<name>.jsonl (`blocks`: only its first items, evals.run.runner)."""
        task, options, limit, repeats = self.tasks[name]
        return run_task(self.engine, task, arm=self.config.name, out_path=self.arm_dir / f"{task.name}.jsonl",
                        limit=self.config.limit if limit is None else limit, repeats=repeats or self.config.repeats,
                        seed=self.config.seed, data_dir=self.config.data_dir, progress=progress, blocks=blocks,
                        reference=options is None or options.reference_signal)


# what an engine knows only once it has run, saved into arm.json's engine_info at close
RAN_ATTRS = {"kv_execution": "kv_execution", "load": "load_record"}


@contextmanager
def open_arm(config: ArmConfig, tasks: Sequence[ArmTask | Task], out_dir: Path) -> Iterator[OpenArm]:
    """Check `out_dir/records/<arm>/` against this configuration, build the engine once and write
    arm.json; the engine is closed on exit."""
    if not tasks:
        raise EvalError("no tasks to run; name at least one task")
    built: list[BuiltTask] = [
        (get_task(t.name, t.options, config.model), t.options, t.limit, t.repeats) if isinstance(t, ArmTask)
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
    log = server_log_path(out_dir, config.name) if config.server is not None else None
    info = EngineSummary(name=engine.info.name, deterministic=engine.info.deterministic,
                         kv=engine_provenance(engine, config.engine_args, log))
    arm_dir.mkdir(parents=True, exist_ok=True)
    manifest.model_copy(update={"engine_info": info}).save(arm_dir / ARM_FILE)
    try:
        yield OpenArm(config, engine, arm_dir, {b[0].name: b for b in built})
    finally:
        try:
            engine.close()  # a vllm arm with the qa_kv plugin checks its rewrite counts here
        finally:
            ran = {k: v for k, attr in RAN_ATTRS.items() if (v := getattr(engine, attr, None)) is not None}
            if ran:  # the qa_kv plugin's checked counts; a loaded arm's scheduler counters
                info = info.model_copy(update=ran)
                manifest.model_copy(update={"engine_info": info}).save(arm_dir / ARM_FILE)


def run_arm(config: ArmConfig, tasks: Sequence[ArmTask | Task], out_dir: Path, *,
            progress: bool = True) -> list[RunSummary]:
    """Run every task for one arm into `out_dir/records/<arm>/` (out_dir is the run directory)."""
    with open_arm(config, tasks, out_dir) as arm:
        return [arm.run(name, progress=progress) for name in arm.tasks]
