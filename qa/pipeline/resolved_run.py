"""`ResolvedRun`: a spec resolved once, the one object every step of `qa run` reads.

Preflight, the dry run, the power plan, the pipeline and the sequential loop read a ResolvedRun; a worker
reads its serializable core, the `ResolvedRecord` the pipeline writes to resolved.json, and builds its arm
with the same two functions the parent uses (`arm_config`, `arm_tasks`), so both sides agree on every
fingerprint by construction. Beside the record a ResolvedRun keeps what cannot be written to a file: the
built task objects with the items they read, the parsed policy, typed engine arguments and server specs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter

from evals.engines import parse_engine_args
from evals.engines.args import EngineArgs
from evals.engines.base import GenerateRequest
from evals.errors import EvalError
from evals.models.resolve import ResolvedModel
from evals.run.arm import ArmConfig, ArmTask
from evals.run.selection import select_items
from evals.servers.spec import ServerSpec, server_spec_from_json
from evals.tasks.base import Item, Request, ServedInSessions, Task, TaskOptions
from qa.errors import QAError
from qa.files.policy import Policy, TaskPolicy
from qa.files.resolved_json import ArmRecord, ResolvedRecord, TaskRecord
from qa.files.rundir import RunDir
from qa.files.spec import RunSpec, TaskSpec
from quant.kv.spec import KVQuantSpec

OPTIONS = TypeAdapter(TaskOptions)  # TaskOptions <-> the JSON of TaskRecord.options


def arm_config(record: ResolvedRecord, arm: ArmRecord, *, base_url: str | None = None) -> ArmConfig:
    """The evals ArmConfig of a resolved arm (with the base_url of the server its worker started)."""
    if arm.engine_args is None:
        raise QAError(f"arm {arm.name!r} runs no engine (engine {arm.engine!r})")
    given = dict(arm.engine_args)
    if base_url is not None:
        given["base_url"] = base_url
    return ArmConfig(name=arm.name, engine=arm.engine, model=arm.load,  # type: ignore[arg-type]
                     engine_args=parse_engine_args(arm.engine, given), server=arm.server_settings,
                     seed=record.seed, data_dir=Path(record.data_dir) if record.data_dir else None, env=dict(arm.env))


def task_options(task: TaskRecord) -> TaskOptions:
    """The evals TaskOptions of a task as resolved.json records them (qa.pipeline.resolve.resolve_task_options
    builds them from the spec)."""
    return OPTIONS.validate_python(task.options)


def arm_tasks(record: ResolvedRecord) -> list[ArmTask]:
    """Every task as each arm runs it (options, limit, repeats)."""
    return [ArmTask(t.name, task_options(t), t.limit, t.repeats) for t in record.tasks]


def server_spec(arm: ArmRecord) -> ServerSpec | None:
    """The typed spec (evals.servers.spec) of the server an arm's worker starts, read back from the arm's record
    (None: the arm has none; qa.pipeline.resolve.resolve_server builds it from the spec)."""
    if arm.server is None:
        return None
    return server_spec_from_json(arm.server.kind, arm.server.spec)


@dataclass(frozen=True)
class ResolvedPolicy:
    """The gate policy with the file it came from (None: the shipped default) and its TOML text."""

    policy: Policy
    ref: str
    path: Path | None
    text: str


@dataclass(frozen=True)
class ResolvedTask:
    """One task: its record, the task object built once, every item it read, and the selection every arm runs."""

    record: TaskRecord
    spec: TaskSpec
    options: TaskOptions
    task: Task
    items: tuple[Item, ...]
    selection: tuple[Item, ...]  # the seeded subset (`limit` items, evals.run.selection.select_items)
    first_request: Request | None  # the request of the task's first item: what its requests look like
    policy: TaskPolicy
    explicit: bool  # named in the policy's [tasks] (qa.gate.rules.select_estimate)

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def items_available(self) -> int:
        return self.record.items_available

    @property
    def n_items(self) -> int:
        """Items of the selection."""
        return self.record.items

    @property
    def repeats(self) -> int:
        return self.record.repeats

    @property
    def samples(self) -> int:
        """Items x repeats."""
        return self.n_items * self.repeats

    @property
    def gated_items(self) -> int:
        """Items the gated estimate pairs (the power plan's n): a session task's turns on one cache path, cold
        if served (qa.compare.cache_path.standard_records: its other paths serve them again), else every item."""
        if not isinstance(self.task, ServedInSessions):
            return self.n_items
        names = self.task.path_names()
        primary = "cold" if "cold" in names else names[0]
        return sum(1 for it in self.selection if it.doc.get("path") == primary)

    @property
    def plan_note(self) -> str:
        """What the task runs (sessions, turns, lengths, ...) in one line, where the task says, else ""."""
        note = getattr(self.task, "plan_note", None)
        return note() if callable(note) else ""

    @property
    def sampled(self) -> bool:
        """True when its requests sample (temperature > 0)."""
        return isinstance(self.first_request, GenerateRequest) and self.first_request.temperature > 0

    @property
    def look_sizes(self) -> tuple[int, ...]:
        """Items at each sequential look (() at fixed n)."""
        return tuple(self.record.look_sizes)

    def first(self, n: int, seed: int) -> frozenset[str]:
        """Item ids of the first `n` items of the selection in the seeded order."""
        return frozenset(it.item_id for it in select_items(self.selection, n, seed))


@dataclass(frozen=True)
class ResolvedArm:
    """One arm: its record, typed engine arguments and server spec, the emulated KV spec, the model (resolved
    once, by qa.pipeline.resolve: nothing downstream looks it up again)."""

    record: ArmRecord
    engine_args: EngineArgs | None  # as its engine receives them (no base_url: a server's is set at start)
    server: ServerSpec | None
    kv: KVQuantSpec | None  # the emulated quantized KV cache it runs (hf engine, a format other than none)
    model: ResolvedModel | None  # None: an lm-eval folder, or a model not on this machine (`problem`)
    problem: str | None = None  # why the arm cannot run here (a real run refuses it; a dry run notes it)
    model_error: EvalError | None = None  # why its model did not resolve (None: it did, or an lm-eval folder)
    # what its engine loads when that is not `model` (record.load: the folder carrying calibrated scales to
    # vLLM), resolved when the folder was there; None: it loads `model`, or the calibration has not written it
    loaded: ResolvedModel | None = None

    @property
    def engine_model(self) -> ResolvedModel | None:
        """The model its engine loads, resolved (None: not resolved here)."""
        return self.model if self.record.load == self.record.model else self.loaded

    @property
    def name(self) -> str:
        return self.record.name


@dataclass(frozen=True)
class ResolvedRun:
    """A spec resolved once: the record written to resolved.json and what only this process holds."""

    spec: RunSpec
    rd: RunDir
    record: ResolvedRecord
    policy: ResolvedPolicy
    tasks: tuple[ResolvedTask, ...]
    arms: tuple[ResolvedArm, ...]

    @property
    def data_dir(self) -> Path | None:
        return Path(self.record.data_dir) if self.record.data_dir else None

    @property
    def seed(self) -> int:
        return self.record.seed

    @property
    def sequential(self) -> bool:
        """Whether any task has sequential looks under the policy."""
        return self.record.sequential

    def arm(self, name: str) -> ResolvedArm:
        """The arm named `name`."""
        for a in self.arms:
            if a.name == name:
                return a
        raise QAError(f"the spec has no arm {name!r}")

    @property
    def candidates(self) -> list[ResolvedArm]:
        """The candidate arms, in spec order."""
        return [a for a in self.arms if a.record.kind == "candidate"]

    def task(self, name: str) -> ResolvedTask:
        """The task named `name`."""
        return next(t for t in self.tasks if t.name == name)

    def out(self, arm: ResolvedArm) -> RunDir:
        """Where a candidate's comparison, verdict and report go: the run root, or candidates/<name>/."""
        if arm.record.out is None:
            raise QAError(f"arm {arm.name!r} is not a candidate")
        return self.rd if arm.record.out == "." else RunDir(self.rd.root / arm.record.out)

    def records_of(self, arm: ResolvedArm) -> Path:
        """The arm's records folder (an lm-eval arm's --log_samples folder)."""
        path = Path(arm.record.records)
        return path if path.is_absolute() else self.rd.root / path

    def config(self, arm: ResolvedArm, *, base_url: str | None = None) -> ArmConfig:
        """The evals ArmConfig of `arm` (`arm_config` on its record)."""
        return arm_config(self.record, arm.record, base_url=base_url)
