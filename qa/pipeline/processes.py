"""Child processes of `qa run`: each arm, the calibration step and the KV inspection run in their own
process (`python -m qa.pipeline.worker RUN_DIR ROLE`), so that engines never share memory, threads or global
state, and so that a vLLM arm can use its own interpreter. A child reads the run's resolved.json, starts
from the offline defaults (evals.offline) with the arm's own variables on top, and dies with its parent
(Linux)."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from evals.offline import offline_env
from evals.run.progress import MODE_ENV, progress_mode
from qa.errors import QAError
from qa.files.resolved_json import ArmRecord

WORKER_MODULE = "qa.pipeline.worker"
RESUME_HINT = "finished samples are kept: re-run the same command to resume"


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when `qa run` dies (Linux), so that no orphaned arm
    keeps appending to the records a restarted run is writing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


CHILD_SETUP = _die_with_parent if sys.platform == "linux" else None


def worker_command(run_dir: Path, role: str, python: str, env: Mapping[str, str] | None = None, *,
                   serve: bool = False) -> tuple[list[str], dict[str, str]]:
    """`python -m qa.pipeline.worker RUN_DIR ROLE [--serve]` and its environment: the offline defaults, this
    process's variables, the progress mode this process chose (evals.run.progress), then `env` (an arm's own
    variables, which reach its server too)."""
    cmd = [python, "-m", WORKER_MODULE, str(run_dir), role]
    return cmd + (["--serve"] if serve else []), offline_env(extra={**progress_env(), **(env or {})})


def progress_env() -> dict[str, str]:
    """The progress mode this process chose for its children (evals.run.progress); outside `bars`, the Hugging Face
    libraries' own tqdm bars (loading weights, downloads) are turned off too: their frames cut a log's lines."""
    mode = progress_mode()
    return {MODE_ENV: mode} if mode == "bars" else {MODE_ENV: mode, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def run_worker(run_dir: Path, role: str, python: str, env: Mapping[str, str] | None = None) -> int:
    """Run the worker (`worker_command`) to the end; its exit code."""
    cmd, child_env = worker_command(run_dir, role, python, env)
    return subprocess.run(cmd, env=child_env, preexec_fn=CHILD_SETUP, check=False).returncode


def arm_python(arm: ArmRecord) -> str:
    """The interpreter of an arm's worker (resolved once; a vLLM arm may have a venv of its own)."""
    if arm.python is None:
        raise QAError(f"arm {arm.name!r} runs no worker")
    return arm.python


def start_arm_worker(run_dir: Path, arm: ArmRecord) -> subprocess.Popen[str]:
    """Start one arm's worker in serve mode (qa.pipeline.sequential: JSON commands on its stdin, answers on its
    stdout); it dies with this process."""
    cmd, child_env = worker_command(run_dir, arm.name, arm_python(arm), arm.env, serve=True)
    return subprocess.Popen(cmd, env=child_env, preexec_fn=CHILD_SETUP,  # noqa: PLW1509 - only a prctl call
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8")


def run_arm_process(run_dir: Path, arm: ArmRecord) -> None:
    """Run one arm in a child process; a failure is one QAError line."""
    rc = run_worker(run_dir, arm.name, arm_python(arm), arm.env)
    if rc != 0:
        raise QAError(f"arm {arm.name!r} stopped with exit code {rc} (see its error above); {RESUME_HINT}")


def run_step(run_dir: Path, step: str, what: str) -> None:
    """Run a worker step (calibrate, kv-inspect) in this interpreter; a failure is one QAError line."""
    rc = run_worker(run_dir, step, sys.executable)
    if rc != 0:
        raise QAError(f"{what} stopped with exit code {rc} (see its error above)")
