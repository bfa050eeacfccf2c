"""A server child's lifecycle on 127.0.0.1: a free port, the spawn (its own session, its output to a log),
the bounded wait on `/health`, and the stop by pid (SIGTERM, then SIGKILL of its process group)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from evals.errors import EngineError

HOST = "127.0.0.1"  # local servers never listen beyond loopback


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, n: int = 15) -> str:
    """The last `n` lines of a server's log ("(no log)" when it cannot be read)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


def spawn(cmd: list[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start `cmd` as the leader of a new session with exactly `env`, its output appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            start_new_session=True,
        )


def stop_pid(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Stop a child started with `start_new_session=True`: SIGTERM its pid (it shuts its own children
    down), wait, then SIGKILL whatever is left of its process group."""
    pgid = process.pid  # a new session's group id is the leader's pid
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    try:  # a child the leader failed to reap (vLLM's engine core, its workers) must not outlive it
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait(timeout=10)


def wait_ready(process: subprocess.Popen[bytes], port: int, log_path: Path, timeout_s: float) -> None:
    """Poll GET /health on 127.0.0.1:`port` until it answers 200; bounded by `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise EngineError(
                    f"server exited with code {process.returncode} before it was ready; "
                    f"its log ({log_path}) ends:\n{log_tail(log_path)}"
                )
            try:
                if client.get(f"http://{HOST}:{port}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    stop_pid(process)
    raise EngineError(
        f"server not ready after {timeout_s:.0f} s (stopped it); its log ({log_path}) ends:\n"
        f"{log_tail(log_path)}"
    )
