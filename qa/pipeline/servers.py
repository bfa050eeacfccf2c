"""The local server of an arm, in its worker: an `openai` arm with a `server` table gets llama.cpp's server
(xllamacpp) or vLLM's api_server on 127.0.0.1 at a free port, started before the arm's tasks and stopped by
pid when the arm ends (also on an error or Ctrl-C). Its spec was resolved once (qa.pipeline.resolve); its log
goes to <run>/logs/<arm>-server.log. A vLLM server with a `kv` table must have logged the qa_kv plugin's
record of the layers it rewrites, once per process that loads the model, by the time it is ready; one that
did not is stopped and the arm refused (it would serve wholly or partly unemulated)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from evals.engines.vllm.kv.record import checked_record, expected_loads, records_from_log
from evals.servers import VllmServerSpec, start_server
from qa.files.resolved_json import ArmRecord
from qa.files.rundir import RunDir
from qa.pipeline.resolved_run import server_spec


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


@contextmanager
def arm_server(arm: ArmRecord, rd: RunDir) -> Iterator[str | None]:
    """Yield the `base_url` of the arm's started server (None when the arm has no server); stop it after."""
    spec = server_spec(arm)
    if spec is None or arm.server is None:
        yield None
        return
    log = rd.root / arm.server.log
    log.parent.mkdir(parents=True, exist_ok=True)
    start = log.stat().st_size if log.is_file() else 0
    with start_server(spec, log_path=log, ready_timeout_s=arm.server.ready_timeout_s) as running:
        if isinstance(spec, VllmServerSpec):
            check_plugin_ran(spec, log, start)
        print(f"{arm.name}: {arm.server.kind} server on {running.base_url} (pid {running.pid}, log {log})", flush=True)
        yield running.base_url
