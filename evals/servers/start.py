"""Start a local server and hand back its running child: the command line and environment of its spec, a free
port on 127.0.0.1, a bounded wait until it answers `/health`, and for a vLLM server with a `kv` table the check
that the qa_kv plugin recorded the layers it rewrites in every process that loads the model (a server that did
not is stopped and refused: it would serve wholly or partly unemulated).

A vLLM server with a `kv` table also starts with VLLM_SERVER_DEV_MODE=1 (over the spec's env), so that its
development endpoint POST /collective_rpc answers the plugin's per-layer counts; like every endpoint of a local
server it listens on 127.0.0.1 only. Once it is up it is registered as counted
(evals.engines.vllm.kv.server_counts.mark_counted) until it is stopped: the `openai` engine built on its
base_url then checks those counts against the tokens the server computed (its `kv_execution`)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from evals.engines.vllm.kv.record import checked_record, expected_loads, records_from_log
from evals.engines.vllm.kv.server_counts import DEV_MODE_ENV, mark_counted, unmark_counted
from evals.servers.commands import llamacpp_command, server_env, vllm_server_command
from evals.servers.process import HOST, free_port, spawn, stop_pid, wait_ready
from evals.servers.spec import LlamaCppServerSpec, ServerKind, VllmServerSpec


@dataclass
class LocalServer:
    """A running child server: stop it with `stop()` (or use it as a context manager)."""

    kind: ServerKind
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    served_model_name: str

    @property
    def pid(self) -> int:
        """The server child's pid (also its process group id)."""
        return self.process.pid

    @property
    def base_url(self) -> str:
        """What the `openai` engine's `base_url` takes: http://127.0.0.1:PORT/v1."""
        return f"http://{HOST}:{self.port}/v1"

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the server's process group (it was started as its own session), then SIGKILL."""
        unmark_counted(self.base_url)
        stop_pid(self.process, timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def check_plugin_ran(spec: VllmServerSpec, log: Path, start: int = 0) -> None:
    """EngineError unless a server started with a `kv` spec logged the plugin's record after byte `start` of
    its log (what this start wrote; the log is appended to), one per process its args say loads the model,
    all alike (evals.engines.vllm.kv.record.checked_record); nothing to check without a `kv` spec."""
    if spec.kv is None:
        return
    text = ""
    if log.is_file():
        with open(log, "rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", errors="replace")
    checked_record(records_from_log(text), expected_loads(spec.args), where=f"the vLLM server's log ({log})")


def started_env(spec: VllmServerSpec | LlamaCppServerSpec) -> dict[str, str]:
    """The environment the server starts with: evals.servers.commands.server_env, and for a vLLM server with a
    `kv` table VLLM_SERVER_DEV_MODE=1 (its /collective_rpc answers the qa_kv plugin's counts)."""
    env = server_env(spec)
    if isinstance(spec, VllmServerSpec) and spec.kv is not None:
        env[DEV_MODE_ENV] = "1"
    return env


def start_server(
    spec: VllmServerSpec | LlamaCppServerSpec,
    *,
    log_path: Path,
    port: int | None = None,
    ready_timeout_s: float | None = None,
) -> LocalServer:
    """Start a server child on 127.0.0.1 and wait (bounded) until it answers /health; a vLLM server with a
    `kv` table must by then have logged the plugin's record (`check_plugin_ran`), else it is stopped and
    EngineError raised, and is then registered as counted until it is stopped (module docstring)."""
    port = port or free_port()
    if isinstance(spec, VllmServerSpec):
        kind: ServerKind = "vllm"
        cmd = vllm_server_command(spec, port)
        timeout = ready_timeout_s or 300.0
    else:
        kind = "llamacpp"
        cmd = llamacpp_command(spec, port)
        timeout = ready_timeout_s or 60.0
    start = log_path.stat().st_size if log_path.is_file() else 0  # what this start writes follows
    process = spawn(cmd, started_env(spec), log_path)
    server = LocalServer(
        kind=kind, port=port, process=process, log_path=log_path, served_model_name=spec.served_model_name
    )
    try:
        wait_ready(process, port, log_path, timeout)
        if isinstance(spec, VllmServerSpec):
            check_plugin_ran(spec, log_path, start)
            if spec.kv is not None:
                mark_counted(server.base_url)
    except BaseException:
        server.stop()
        raise
    return server
