"""The local server of an arm: an `openai` arm with a `server` table gets llama.cpp's server
(xllamacpp) or vLLM's api_server on 127.0.0.1 at a free port, started before the arm's tasks and
stopped by pid when the arm ends (also on an error or Ctrl-C). Its log: <run>/logs/<arm>-server.log."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from qa.files.rundir import RunDir
from qa.files.spec import ArmRole, RunSpec, ServerSpec


def server_spec(spec: RunSpec, role: ArmRole, *, python: str | None = None,
                hub_ok: bool = False) -> Any:  # -> LlamaCppServerSpec | VllmServerSpec
    """The evals.servers spec of an arm's `server` table (model files resolved, nothing started; a vLLM
    server run by `python`, default evals.servers.vllm_python(); `hub_ok`: a hub id stands for its
    folder, as the dry run shows a GPU spec); the arm's `env` is the server's."""
    from evals.errors import ModelError
    from evals.models import gguf_file, resolve_model
    from evals.servers import LlamaCppServerSpec, VllmServerSpec, check_cache_type

    server: ServerSpec | None = spec.arms[role].server
    if server is None:
        raise ValueError(f"arm {role!r} has no server table")  # internal: callers check first
    model = spec.arm_model(role)
    if server.kind == "llamacpp":
        gguf = Path(server.gguf) if server.gguf else gguf_file(model)
        if not gguf.is_file():
            raise ModelError(f"arm {role}: server.gguf {str(gguf)!r} is not a file")
        return LlamaCppServerSpec(
            gguf=gguf, cache_type_k=check_cache_type(server.cache_type_k),
            cache_type_v=check_cache_type(server.cache_type_v), flash_attn=server.flash_attn,
            rotate_kv=server.rotate_kv, n_ctx=server.n_ctx, n_parallel=server.n_parallel, threads=server.threads,
            env=dict(spec.arms[role].env),
        )
    try:
        folder = resolve_model(model).path
    except ModelError:
        if not (hub_ok and "/" in model):  # a GPU spec's hub id need not be on this machine
            raise
        folder = None
    if folder is None and not hub_ok:
        raise ModelError(f"arm {role}: a vllm server needs a local model folder; {model!r} is a hub id")
    from evals.servers import vllm_python

    return VllmServerSpec(model=folder or Path(model), args=dict(server.args), python=python or vllm_python(),
                          env=dict(spec.arms[role].env))


@contextmanager
def arm_server(spec: RunSpec, role: ArmRole, rd: RunDir) -> Iterator[str | None]:
    """Yield the `base_url` of the arm's started server (None when the arm has no `server`); stop it after."""
    from evals.servers import start_server

    server = spec.arms[role].server
    if server is None:
        yield None
        return
    log = rd.server_log(role)
    log.parent.mkdir(parents=True, exist_ok=True)
    with start_server(server_spec(spec, role), log_path=log, ready_timeout_s=server.ready_timeout_s) as running:
        print(f"{role}: {server.kind} server on {running.base_url} (pid {running.pid}, log {log})", flush=True)
        yield running.base_url
