"""The llama.cpp server child: `python -m evals.servers llamacpp ...` (evals.servers.commands.llamacpp_command)
runs xllamacpp's server in this process on 127.0.0.1 until SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from evals.servers.process import HOST
from evals.servers.spec import LLAMACPP_CACHE_TYPES


def serve_llamacpp(ns: argparse.Namespace) -> None:
    """Run xllamacpp's server in this process until SIGTERM."""
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
    serve_llamacpp(parser.parse_args(argv))
