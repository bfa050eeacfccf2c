"""The local server of an arm, in its worker: an `openai` arm with a `server` table gets llama.cpp's server
(xllamacpp) or vLLM's api_server on 127.0.0.1 at a free port, started before the arm's tasks and stopped by
pid when the arm ends (also on an error or Ctrl-C). Its spec was resolved once (qa.pipeline.resolve); its log
goes to <run>/logs/<arm>-server.log. A vLLM server with a `kv` table is refused as it starts unless the qa_kv
plugin logged its record of the layers it rewrites (evals.servers.start.check_plugin_ran)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from evals.servers.start import start_server
from qa.files.resolved_json import ArmRecord
from qa.files.rundir import RunDir
from qa.pipeline.resolved_run import server_spec


@contextmanager
def arm_server(arm: ArmRecord, rd: RunDir) -> Iterator[str | None]:
    """Yield the `base_url` of the arm's started server (None when the arm has no server); stop it after."""
    spec = server_spec(arm)
    if spec is None or arm.server is None:
        yield None
        return
    log = rd.root / arm.server.log
    with start_server(spec, log_path=log, ready_timeout_s=arm.server.ready_timeout_s) as running:
        print(f"{arm.name}: {arm.server.kind} server on {running.base_url} (pid {running.pid}, log {log})", flush=True)
        yield running.base_url
