"""Quantize+dequantize throughput of every KV format on a KV-shaped bf16 tensor, next to the references.

One run times, on the same [tokens, kv_heads, head_dim] bf16 tensor (default 8192 x 8 x 128):
- `copy`: x.to(float32), the memory floor (one read of bf16, one write of fp32);
- every registered format: dequantize(quantize(x, d)) with a static per-tensor decode scale d (eager),
  NVFP4's torch.compile'd path (`get_format("nvfp4", fused=True)`), and the KV cache's write path on
  CPU, `quantize_dequantize` (bytes and values from one compiled loop, `nvfp4_fused.roundtrip`);
- the NVFP4 CPU references: compressed-tensors (qparams + quantize + dequantize) and torchao
  (NVFP4Tensor.to_nvfp4 + dequantize), when installed.
It prints the best-of-N wall and CPU time per call (candidates interleaved round by round) and their
ratios to the copy, and the NVFP4 speed-ups over each reference. Usage: python -m benchmarks.quant_speed [--tokens 8192] [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch

from quant.formats import compiled
from quant.formats.registry import FORMAT_NAMES, get_format, quantize_dequantize

COPY = "copy bf16->fp32 (floor)"
ROUND_TRIP = "nvfp4 KV round trip"


def time_round_robin(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """Best-of-`repeats` (wall s, process CPU s) per function, timed in interleaved rounds after a warm-up.

    Interleaving makes every candidate see the same background load, so the ratios stay fair on a
    shared machine; CPU time (all threads of this process) is the less noisy of the two.
    """
    for fn in fns.values():
        fn()
    best = {name: (float("inf"), float("inf")) for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def compressed_tensors_nvfp4(x: torch.Tensor) -> Callable[[], torch.Tensor] | None:
    """compressed-tensors' NVFP4 fake-quantization of x [..., D] (CPU eager path), or None if absent."""
    try:
        # compressed_tensors: an optional test oracle (dev extra), heavy; timed only when installed
        from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize  # heavy
        from compressed_tensors.quantization.quant_scheme import NVFP4  # heavy
        from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam  # heavy
    except ImportError:
        return None
    args = NVFP4["weights"]
    x2d = x.reshape(-1, x.shape[-1])  # [tokens * heads, D]: ct's group quantization is 2-D
    amax = x2d.abs().amax().float().reshape(1)
    gs = generate_gparam(-amax, amax)

    def run() -> torch.Tensor:
        xf = x2d.float()
        groups = xf.reshape(xf.shape[0], -1, 16)  # [rows, D/16, 16]
        scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), args, global_scale=gs)
        q = quantize(xf, scale, zp, args, global_scale=gs)
        return dequantize(q, scale, zp, args, global_scale=gs, dtype=torch.float32)

    return run


def torchao_nvfp4(x: torch.Tensor) -> Callable[[], torch.Tensor] | None:
    """torchao's NVFP4Tensor round trip of x [..., D] with a per-tensor scale, or None if absent."""
    try:
        # torchao: an optional test oracle (dev extra), heavy; timed only when installed
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale  # heavy
    except ImportError:
        return None
    x2d = x.reshape(-1, x.shape[-1])  # [tokens * heads, D]: torchao takes 2-D or 3-D
    d = per_tensor_amax_to_scale(x2d.abs().amax())

    def run() -> torch.Tensor:
        return NVFP4Tensor.to_nvfp4(x2d, per_tensor_scale=d).dequantize(torch.float32)

    return run


def main() -> None:
    """Time every format and reference; print a table of ms per call and ratios to the copy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--formats", nargs="*", default=list(FORMAT_NAMES))
    parser.add_argument("--no-fused", action="store_true", help="skip the torch.compile'd NVFP4 path")
    opts = parser.parse_args()
    os.environ[compiled.WARMUP_ENV] = "0"  # the compiled path from the first call: it is what is timed
    if opts.threads:
        torch.set_num_threads(opts.threads)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(opts.tokens, opts.heads, opts.head_dim, generator=g).to(torch.bfloat16)
    print(f"x: {tuple(x.shape)} bf16, {torch.get_num_threads()} threads, best of {opts.repeats}")

    fns: dict[str, Callable[[], object]] = {COPY: lambda: x.to(torch.float32)}
    amax = x.abs().amax()
    for name in opts.formats:
        fmt = get_format(name)
        d = fmt.decode_scale_from_amax(amax) if fmt.needs_tensor_scale else None
        fns[name] = lambda fmt=fmt, d=d: fmt.dequantize(fmt.quantize(x, d))
    if not opts.no_fused:
        fused = get_format("nvfp4", fused=True)
        d_fused = fused.decode_scale_from_amax(amax)
        start = time.perf_counter()
        fused.dequantize(fused.quantize(x, d_fused))  # compiles (or loads inductor's disk cache)
        print(f"nvfp4 fused: first call (compile) {time.perf_counter() - start:.1f} s")
        fns["nvfp4 fused"] = lambda: fused.dequantize(fused.quantize(x, d_fused))
        plain = get_format("nvfp4")
        start = time.perf_counter()
        quantize_dequantize(plain, x, d_fused, torch.float32)
        print(f"nvfp4 KV round trip: first call (compile) {time.perf_counter() - start:.1f} s")
        fns[ROUND_TRIP] = lambda: quantize_dequantize(plain, x, d_fused, torch.float32)
    refs = {"compressed-tensors nvfp4": compressed_tensors_nvfp4(x), "torchao nvfp4": torchao_nvfp4(x)}
    for label, fn in refs.items():
        if fn is None:
            print(f"{label}: not installed (pip install 'accuracy-parity[dev]')")
        else:
            fns[label] = fn

    times = time_round_robin(fns, opts.repeats)
    copy_wall, copy_cpu = times[COPY]
    print(f"{'what':28s} {'wall ms':>9s} {'x copy':>8s} {'cpu ms':>9s} {'x copy':>8s}")
    for label, (wall, cpu) in times.items():
        print(f"{label:28s} {wall * 1e3:9.1f} {wall / copy_wall:8.2f} {cpu * 1e3:9.1f} {cpu / copy_cpu:8.2f}")
    if ROUND_TRIP in times and "nvfp4" in times:
        print(f"{ROUND_TRIP} is {times['nvfp4'][0] / times[ROUND_TRIP][0]:.2f}x faster than eager nvfp4 "
              f"quantize + dequantize (cpu time: {times['nvfp4'][1] / times[ROUND_TRIP][1]:.2f}x)")
    for name in ("nvfp4", "nvfp4 fused", ROUND_TRIP, "nvfp4_4over6"):
        for ref in refs:
            if name in times and ref in times:
                print(
                    f"{name} is {times[ref][0] / times[name][0]:.2f}x faster than {ref} "
                    f"(cpu time: {times[ref][1] / times[name][1]:.2f}x)"
                )


if __name__ == "__main__":
    main()
