"""How a local server is started: its exact command line (what starts it, what the dry run prints and what
evals.engines.vllm.check parses with vLLM's own parser) and its environment (offline by default, the qa_kv
plugin switched on only by a vLLM server's `kv` table)."""

from __future__ import annotations

import os
import sys

from evals.engines.vllm.args import RESERVED_SERVER_ARGS, cli_flags
from evals.engines.vllm.kv.spec import PLUGIN_ENV, RAY_COPY_ENV, plugin_env
from evals.errors import EngineError
from evals.offline import offline_env
from evals.servers.interpreter import vllm_python
from evals.servers.process import HOST
from evals.servers.spec import UNQUANTIZED_CACHE_TYPES, LlamaCppServerSpec, VllmServerSpec, check_cache_type

VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
LLAMACPP_CHILD_MODULE = "evals.servers"  # `python -m evals.servers llamacpp ...`: evals.servers.llamacpp


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
    """The llama.cpp server child (evals.servers.llamacpp, run by this interpreter) for `spec` on
    127.0.0.1:`port`."""
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
        LLAMACPP_CHILD_MODULE,
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


def kv_plugin_env(spec: VllmServerSpec) -> dict[str, str]:
    """The variables that switch the qa_kv plugin on in a vLLM server for its `kv` spec (empty when None);
    EngineError for a spec that also sets QA_VLLM_KV in its `env` (two switches, one ignored). What vLLM can
    honour of the spec is checked where the run is resolved and by the plugin (evals.engines.vllm.kv.spec)."""
    if spec.kv is None:
        if PLUGIN_ENV in spec.env:
            raise EngineError(f"vllm server: env.{PLUGIN_ENV} would switch the qa_kv plugin on unchecked; "
                              "give the server a kv table instead")
        return {}
    if PLUGIN_ENV in spec.env:
        raise EngineError(f"vllm server: env.{PLUGIN_ENV} and a kv table both switch the qa_kv plugin on; "
                          f"keep the kv table and drop env.{PLUGIN_ENV}")
    return plugin_env(spec.kv, ray_extra=spec.env.get(RAY_COPY_ENV, os.environ.get(RAY_COPY_ENV, "")))


def server_env(spec: VllmServerSpec | LlamaCppServerSpec) -> dict[str, str]:
    """The server's environment: evals.offline.offline_env (the offline defaults < this process's
    environment < the spec's env, and a vLLM server's kv spec over all of them; llama.cpp's K
    rotation switched off first when the spec says so; QA_VLLM_KV only from a vLLM server's kv table)."""
    if isinstance(spec, VllmServerSpec):
        env = offline_env(extra={**spec.env, **kv_plugin_env(spec)})
        if spec.kv is None:  # inherited from qa run's environment: a server without a kv table runs plain
            env.pop(PLUGIN_ENV, None)
        return env
    return offline_env(extra={**({} if spec.rotate_kv else {"LLAMA_ATTN_ROT_DISABLE": "1"}), **spec.env})
