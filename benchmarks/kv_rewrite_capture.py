"""The vLLM plugin's per-layer K/V rewrite (evals.engines.vllm.kv.emulate.rewrite_pair) against a plain copy of
the same K and V, side by side in one run: the rewrite's cost per cache write as a ratio.

K and V are [T, H, D] bf16 (default H 8, D 128, a Llama-3-8B layer), T at decode sizes (1, 16) and a prefill
size (2048). Each format's plan has constant decode scales where the format takes one. Timed, per format and
T, the best of --repeats interleaved rounds of --inner calls each:
- `copy`: K.clone() and V.clone() (what the rewrite must at least read and write);
- `rewrite`: rewrite_pair with its counters (one compiled call: inductor's C++ on CPU, Triton on CUDA);
- `eager`: the same values with the compiled path off (quant.formats.compiled: QA_KV_COMPILED=0);
- CPU only: `reference`, two quantize_dequantize calls (the hf cache's path, with its host checks);
- CUDA only: `copy (graph)` and `rewrite (graph)`, each captured once in a CUDA graph and replayed
  --inner times (what vLLM's FULL_AND_PIECEWISE mode runs for a decode batch).
Prints microseconds per call and each ratio to the copy of the same mode; writes the table as JSON to
<out>/kv_rewrite_capture_<device>.json.

Usage: python -m benchmarks.kv_rewrite_capture [--out reports/benchmarks/kv_rewrite_capture] [--device auto]
       [--formats nvfp4 fp8_e4m3] [--tokens 1 16 2048] [--repeats 5] [--inner 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from evals.engines.vllm.kv.emulate import LayerPlan, layer_plan, rewrite_pair
from quant.errors import QuantError
from quant.formats import compiled
from quant.formats.registry import FORMAT_NAMES, quantize_dequantize
from quant.kv.spec import KVQuantSpec

REPO = Path(__file__).resolve().parents[1]
HEADS, HEAD_DIM = 8, 128
SCALE = 0.004  # constant decode scale of the tensor-scaled formats (a K amax of ~11 for NVFP4: 11 / 2688)
PLUGIN_FORMATS = ("nvfp4", "nvfp4_4over6", "qa_mxfp4", "fp8_e4m3", "fp8_e5m2", "qa_int8", "qa_int4", "none")


def plan_for(name: str, device: torch.device) -> LayerPlan:
    """Layer 0's plan for format `name` on `device`, constant scales where the format takes one."""
    given: dict[str, Any] = {"format": name}
    if name.startswith(("nvfp4", "fp8")):
        given |= {"scales": "constant", "constant_scale": SCALE}
    return layer_plan(KVQuantSpec.model_validate(given), None, 0).to(device)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so a wall time covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_of(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int,
            inner: int) -> dict[str, float]:
    """Best-of-`repeats` seconds per call of each function, `inner` calls per timing, interleaved rounds."""
    for fn in fns.values():  # warm-up (compiles)
        fn()
        fn()
    sync(device)
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            sync(device)
            best[name] = min(best[name], (time.perf_counter() - start) / inner)
    return best


def eager(fn: Callable[[], object]) -> Callable[[], object]:
    """fn with the compiled path switched off for its call."""

    def run() -> object:
        before = os.environ.get(compiled.ENV)
        os.environ[compiled.ENV] = "0"
        try:
            return fn()
        finally:
            if before is None:
                os.environ.pop(compiled.ENV)
            else:
                os.environ[compiled.ENV] = before

    return run


def graphed(fn: Callable[[], object], device: torch.device) -> Callable[[], object]:
    """fn captured once in a CUDA graph (after a warm-up on a side stream); the result replays it."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def row(name: str, tokens: int, device: torch.device, repeats: int, inner: int) -> dict[str, Any]:
    """Times of one format at one token count, and their ratios to the copy."""
    gen = torch.Generator().manual_seed(tokens)
    k, v = ((torch.randn(tokens, HEADS, HEAD_DIM, generator=gen) * 3).to(torch.bfloat16).to(device)
            for _ in range(2))
    plan = plan_for(name, device)
    fns: dict[str, Callable[[], object]] = {
        "copy": lambda: (k.clone(), v.clone()),
        "rewrite": lambda: rewrite_pair(plan, k, v),
        "eager": eager(lambda: rewrite_pair(plan, k, v)),
    }
    if device.type == "cpu":
        fns["reference"] = lambda: (quantize_dequantize(plan.fmt, k, plan.k_scale, k.dtype)[1],
                                    quantize_dequantize(plan.fmt, v, plan.v_scale, v.dtype)[1])
    else:
        fns["copy (graph)"] = graphed(fns["copy"], device)
        fns["rewrite (graph)"] = graphed(fns["rewrite"], device)
    times = best_of(fns, device, repeats, inner)
    base = {key: times["copy (graph)" if "graph" in key else "copy"] for key in times}
    return {"format": name, "tokens": tokens, "us": {key: t * 1e6 for key, t in times.items()},
            "ratio_to_copy": {key: t / base[key] for key, t in times.items() if not key.startswith("copy")}}


def main(argv: list[str] | None = None) -> int:
    """Run the table, print it, write its JSON; 2 on bad arguments."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "benchmarks" / "kv_rewrite_capture")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--formats", nargs="+", default=None,
                        help="default: nvfp4 fp8_e4m3 on CPU (each compiles for tens of seconds), every format on CUDA")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--inner", type=int, default=20)
    ns = parser.parse_args(argv)
    use_cuda = ns.device == "cuda" or ns.device == "auto" and torch.cuda.is_available()
    if use_cuda and not torch.cuda.is_available():
        print("kv_rewrite_capture: --device cuda, but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda" if use_cuda else "cpu")
    formats = ns.formats or (list(PLUGIN_FORMATS) if use_cuda else ["nvfp4", "fp8_e4m3"])
    unknown = [f for f in formats if f not in FORMAT_NAMES]
    if unknown or min(ns.tokens) < 1 or ns.repeats < 1 or ns.inner < 1:
        print(f"kv_rewrite_capture: unknown format {unknown[0]!r}" if unknown else
              "kv_rewrite_capture: --tokens, --repeats and --inner must be at least 1", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name(device) if use_cuda else platform.processor() or platform.machine()
    result = {"device": device.type, "device_name": where, "torch": torch.__version__, "heads": HEADS,
              "head_dim": HEAD_DIM, "dtype": "bfloat16", "repeats": ns.repeats, "inner": ns.inner,
              "threads": torch.get_num_threads(), "rows": []}
    ns.out.mkdir(parents=True, exist_ok=True)
    path = ns.out / f"kv_rewrite_capture_{device.type}.json"
    try:
        for name in formats:
            for tokens in ns.tokens:
                r = row(name, tokens, device, ns.repeats, ns.inner)
                result["rows"].append(r)
                result["compiled_failure"] = compiled.failure()  # not None: `rewrite` ran eagerly after it
                path.write_text(json.dumps(result, indent=1) + "\n")  # after every row: a cut-off run keeps its rows
                ratios = "  ".join(f"{key} {ratio:.2f}x" for key, ratio in r["ratio_to_copy"].items())
                print(f"{name:>13} T={tokens:<5} copy {r['us']['copy']:9.1f} us   {ratios}", flush=True)
    except QuantError as exc:
        print(f"kv_rewrite_capture: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
