"""`qa run --dry-run`: what a run would do, without loading a model: engine arguments (a vLLM
server's exact command line, an offline vLLM arm's exact `LLM(...)` keywords) and item counts.

Every vLLM arm's arguments are checked by vLLM itself in the interpreter that will run them
(evals.engines.vllm_check, one child process for all arms), here and in `qa run`'s preflight: a
refused arm is one EngineError line before any arm runs. Where vLLM is not installed the dry run
says so in the arm's notes and still shows the command; a real run refuses.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evals.engines.base import GenerateRequest
from evals.engines.vllm_args import VllmEngineArgs, check_offline_flags, engine_kwargs, is_gpu_spec
from evals.engines.vllm_check import ArmCheck, check_with_vllm
from evals.env import redact_env
from evals.errors import EngineError, EvalError
from evals.tasks.base import Item, Task
from qa.run.arm_inputs import resolved_engine_args, task_options
from qa.files.rundir import RunDir
from qa.files.spec import ArmRole, RunSpec

PORT_SHOWN = "<free port>"  # a server's port is picked when it starts


@dataclass(frozen=True)
class PlannedTask:
    """One task of one arm as a dry run sees it."""

    task: str
    items_available: int
    items: int
    repeats: int

    @property
    def samples(self) -> int:
        return self.items * self.repeats


@dataclass(frozen=True)
class PlannedArm:
    """One arm as a dry run sees it: engine, model, resolved engine arguments, tasks."""

    role: ArmRole
    engine: str
    model: str
    engine_args: dict[str, Any]
    tasks: tuple[PlannedTask, ...]
    server: dict[str, Any] | None = None  # the local server `qa run` starts for the arm (+ its "command")
    command: tuple[str, ...] = ()  # that server's exact command line (the port shown as PORT_SHOWN)
    env: dict[str, str] = field(default_factory=dict)  # the arm's own variables, secrets redacted
    notes: tuple[str, ...] = ()  # what vLLM's own check said, or why it could not run here


def dry_run(spec: RunSpec, data_dir: Path | None, run_dir: Path | None = None, *,
            require_vllm: bool = False) -> list[PlannedArm]:
    """Every arm's engine arguments and item counts (every task built and its data read), every vLLM arm
    checked by vLLM (EngineError on a refusal; with `require_vllm`, also when vLLM is not installed)."""
    from evals.tasks import get_task

    tasks: list[PlannedTask] = []
    first: list[tuple[str, Task, Item]] = []  # each task's first item: what its requests look like
    for t in spec.tasks:
        task = get_task(t.name, task_options(t, spec.chat), spec.model)
        items = task.items(data_dir)
        n = len(items)
        tasks.append(PlannedTask(t.name, n, min(n, t.limit) if t.limit else n, t.repeats))
        if items:
            first.append((t.name, task, items[0]))
    check_served_requests(spec, first)
    rd = RunDir(run_dir) if run_dir is not None else None
    out: list[PlannedArm] = []
    for role, arm in spec.arms.items():
        if arm.engine == "lmeval":
            out.append(PlannedArm(role, arm.engine, spec.arm_model(role), {}, ()))
            continue
        parsed = resolved_engine_args(spec, role, rd)
        args: dict[str, Any] = parsed.model_dump(mode="json")
        if isinstance(parsed, VllmEngineArgs):
            # A spec written for GPUs is shown as it would be built there, not as this CPU would build it.
            gpu_spec = is_gpu_spec(parsed.flags())
            try:
                check_offline_flags(parsed.flags())  # refused here too when vLLM is not installed
            except EngineError as exc:
                raise EngineError(f"arm {role!r}: {exc}") from None
            args = dict(engine_kwargs(spec.arm_model(role), parsed, on_cpu=False if gpu_spec else None))
        server = arm.server.model_dump(exclude_none=True) if arm.server is not None else None
        command = tuple(server_command(spec, role)) if arm.server is not None else ()
        if server is not None and command:
            server["command"] = shlex.join(command)
        out.append(PlannedArm(role, arm.engine, spec.arm_model(role), args, tuple(tasks), server, command,
                              redact_env(arm.env)))
    return check_vllm_arms(spec, out, require_vllm=require_vllm)


def check_served_requests(spec: RunSpec, first: list[tuple[str, Task, Item]]) -> None:
    """Refuse, before anything runs, what a served arm would refuse or ignore on every sample: a scoring
    task on a chat endpoint, a sampling key its kind of server ignores, and (a vLLM server `qa run`
    starts) more stop strings than its VLLM_MAX_STOP_STRINGS. A server of unknown kind is checked when the
    arm starts (the kind is read from GET /models)."""
    from evals.engines.openai_api.args import OpenAIArgs
    from evals.engines.openai_api.sampling import check_sampling

    for role, arm in spec.arms.items():
        args = arm.engine_args
        if not isinstance(args, OpenAIArgs):
            continue
        kind = args.server_kind or (arm.server.kind if arm.server is not None else None)
        for name, task, item in first:
            if task.kind != "generate":
                if args.api == "chat":
                    raise EngineError(f"arm {role!r}, task {name}: a chat endpoint cannot score given text "
                                      f"({task.kind}); use api = \"completions\" for this arm")
                continue
            req = task.request(item, repeat=0, seed=spec.seed)
            if not isinstance(req, GenerateRequest) or kind is None:
                continue
            try:
                check_sampling(kind, args.api, [req], f"arm {role!r}'s server")
            except EngineError as exc:
                raise EngineError(f"task {name}: {exc}") from None
            limit = arm.env.get("VLLM_MAX_STOP_STRINGS", "4")
            if arm.server is not None and kind == "vllm" and limit.isdigit() and len(req.until) > int(limit):
                raise EngineError(f"arm {role!r}, task {name}: {len(req.until)} stop strings, but a vLLM server "
                                  f"takes VLLM_MAX_STOP_STRINGS = {limit}; set env = {{ VLLM_MAX_STOP_STRINGS = "
                                  f"\"{len(req.until)}\" }} on the arm")


def vllm_python_or_none() -> str | None:
    """The interpreter that runs vLLM, or None when there is none."""
    from evals.servers import vllm_python

    try:
        return vllm_python()
    except EngineError:
        return None


def server_command(spec: RunSpec, role: ArmRole) -> list[str]:
    """An arm's server command line as `qa run` would start it (the port shown as PORT_SHOWN)."""
    from evals.servers import VllmServerSpec, llamacpp_command, vllm_server_command
    from qa.run.servers import server_spec

    server = spec.arms[role].server
    if server is not None and server.kind == "vllm":
        built = server_spec(spec, role, python=vllm_python_or_none() or "python", hub_ok=True)
        assert isinstance(built, VllmServerSpec)
        cmd = vllm_server_command(built, 0)
    else:
        cmd = llamacpp_command(server_spec(spec, role), 0)
    at = cmd.index("--port") + 1
    return [*cmd[:at], PORT_SHOWN, *cmd[at + 1:]]


def vllm_checks(spec: RunSpec, planned: list[PlannedArm]) -> list[ArmCheck]:
    """What vLLM is asked about each vLLM arm: a server's command line, an offline arm's LLM keywords."""
    from evals.models import resolve_model

    checks: list[ArmCheck] = []
    for arm in planned:
        own = spec.arms[arm.role]
        if own.server is not None and own.server.kind == "vllm":
            argv = [v if v != PORT_SHOWN else "0" for v in arm.command[3:]]  # after `python -m MODULE`
            checks.append(ArmCheck(arm=arm.role, kind="server", argv=argv, env=dict(own.env),
                                   gpu_spec=is_gpu_spec(own.server.args)))
        elif isinstance(own.engine_args, VllmEngineArgs):
            try:
                model = resolve_model(arm.model).load_id
            except EvalError:  # a GPU spec's hub id need not be here: vLLM's check does not look it up
                model = arm.model
            checks.append(ArmCheck(arm=arm.role, kind="offline", kwargs={"model": model, **arm.engine_args},
                                   env=dict(own.env), gpu_spec=is_gpu_spec(own.engine_args.flags()),
                                   allow_unsupported_kv_cache_dtype=own.engine_args.allow_unsupported_kv_cache_dtype))
    return checks


def check_vllm_arms(spec: RunSpec, planned: list[PlannedArm], *, require_vllm: bool) -> list[PlannedArm]:
    """The plan with vLLM's own verdict on every vLLM arm in its notes; EngineError on the first refusal."""
    checks = vllm_checks(spec, planned)
    if not checks:
        return planned
    python = vllm_python_or_none()
    if python is None:
        from evals.servers import vllm_python

        if require_vllm:
            vllm_python()  # raises the one-line install hint
        missing = ("vLLM arguments not checked: vllm is not installed here, in .venv-vllm or at "
                   "QA_VLLM_PYTHON (scripts/setup.sh --vllm)")
        names = {c.arm for c in checks}
        return [replace(a, notes=(*a.notes, missing)) if a.role in names else a for a in planned]
    report = check_with_vllm(checks, python)
    report.raise_first()
    notes = {o.arm: (f"arguments checked by vLLM {report.vllm} ({python})", *o.notes) for o in report.outcomes}
    return [replace(a, notes=(*a.notes, *notes[a.role])) if a.role in notes else a for a in planned]
