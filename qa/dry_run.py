"""`qa run --dry-run`: what a run would do, without loading a model: engine arguments and item counts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.engines.vllm_args import VllmEngineArgs, engine_kwargs
from qa.arm_inputs import resolved_engine_args, task_options
from qa.rundir import RunDir
from qa.spec import ArmRole, RunSpec


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
    server: dict[str, Any] | None = None  # the local server `qa run` starts for the arm


def dry_run(spec: RunSpec, data_dir: Path | None, run_dir: Path | None = None) -> list[PlannedArm]:
    """Every arm's engine arguments and item counts (every task built and its data read)."""
    from evals.tasks import get_task

    tasks: list[PlannedTask] = []
    for t in spec.tasks:
        n = len(get_task(t.name, task_options(t, spec.chat)).items(data_dir))
        tasks.append(PlannedTask(t.name, n, min(n, t.limit) if t.limit else n, t.repeats))
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
            gpu_spec = any(k in parsed.flags() for k in ("tensor_parallel_size", "data_parallel_size",
                                                          "gpu_memory_utilization"))
            args = dict(engine_kwargs(spec.arm_model(role), parsed, on_cpu=False if gpu_spec else None))
        server = arm.server.model_dump(exclude_none=True) if arm.server is not None else None
        out.append(PlannedArm(role, arm.engine, spec.arm_model(role), args, tuple(tasks), server))
    return out
