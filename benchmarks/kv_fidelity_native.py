"""Native against emulated: vLLM's own quantized KV cache (`kv_cache_dtype` fp8_e4m3, fp8_e5m2, nvfp4, ...)
beside the qa_kv plugin emulating the same format on an unquantized cache, on the same WikiText-2 tokens as
benchmarks.kv_fidelity (the same chunks, teacher-forced prompt log-probs, the same statistics), with the
same scales, on whatever device vLLM runs on (vLLM-CPU here; a user's GPU for nvfp4).

Arms, each one vLLM start (this module again in vLLM's interpreter, `--worker`): `auto` (the unquantized
baseline), and per native dtype `native` (kv_cache_dtype = it) and `plugin` (auto + the plugin). The
plugin's spec follows what the native path does: FP8 codes truncated on vLLM-CPU (its cache write), rounded
to nearest elsewhere; for nvfp4 on SM100 (trtllm-gen) Q and the attention output rounded to FP8 E4M3
(query_format / output_format; vLLM's FlashInfer FA2 path on SM80 / SM90 / SM120 keeps them in the model
dtype). Scales: a model folder that carries K/V scales (`qa calibrate --export-model-folder`) is read by vLLM
as the checkpoint's and by the plugin as `scales = DIR`; otherwise both take 1.0 (vLLM's default).

Per native dtype: KL(native || plugin) (the emulation's error against the real cache), KL(auto || native)
and KL(auto || plugin) with their ratio (95% paired bootstrap CI over chunks), top-1 agreement and the
largest |log-prob| difference of the scored token. Writes <out>/fidelity_native.json and <out>/TABLE.md.

    QA_DATA_DIR=../shared/data .venv/bin/python -m benchmarks.kv_fidelity_native --native nvfp4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from benchmarks.kv_fidelity import Run, chunk_tokens, kl_cell, pair_stats, ratio_ci, verdict
from evals.engines.vllm.introspect import kv_provenance
from evals.engines.vllm.kv.switch import loaded_record, plugin_on
from evals.models.resolve import resolve_model
from evals.servers.interpreter import vllm_python
from qa.errors import USER_ERRORS
from qa.files.portable import portable_text
from quant.fileio import atomic_write_text
from quant.kv.spec import kv_spec_from_dict
from quant.scales.folder import has_kv_scales

REPO = Path(__file__).resolve().parent.parent
MODULE = "benchmarks.kv_fidelity_native"
OUT = REPO / "reports" / "benchmarks" / "kv_fidelity" / "native"
# native kv_cache_dtype -> the format the plugin emulates for it
EMULATED: dict[str, str] = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "nvfp4": "nvfp4"}


def plugin_kv(native: str, scales: dict, device: str) -> dict:
    """The plugin's kv spec for the native dtype `native` on `device` ("cpu", "cuda-sm100", "cuda")."""
    kv = {"format": EMULATED[native], **scales}
    if kv["format"].startswith("fp8") and device == "cpu":
        kv["fp8_rounding"] = "toward_zero"  # vLLM-CPU's cache write truncates (csrc/cpu/cpu_attn_fp8.hpp)
    if kv["format"] == "nvfp4" and device == "cuda-sm100":  # trtllm-gen: FP8 query, FP8 output buffer
        kv.update(query_format="fp8_e4m3", output_format="fp8_e4m3")
    return kv


def device_kind() -> str:
    """"cpu", "cuda-sm100" (a Blackwell data-centre GPU: vLLM's trtllm-gen NVFP4 path) or "cuda"."""
    import torch  # torch: in vLLM's interpreter (the worker)

    if not torch.cuda.is_available():
        return "cpu"
    return "cuda-sm100" if torch.cuda.get_device_capability()[0] == 10 else "cuda"


def worker(job: Path, result: Path) -> None:
    """Child entry (vLLM's interpreter): prompt log-probs of every chunk on one arm."""
    spec = json.loads(job.read_text())
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    import vllm  # vllm: only in vLLM's interpreter (this worker), after the setting above

    kv = plugin_kv(spec["native"], spec["scales"], device_kind()) if spec["arm"] == "plugin" else None
    model = spec["model"] if spec["arm"] == "native" else spec["plain_model"]  # no KV scheme for auto / plugin
    dtype = spec["native"] if spec["arm"] == "native" else "auto"
    with plugin_on(kv_spec_from_dict(kv)) if kv else nullcontext() as folder:
        llm = vllm.LLM(model=model, dtype="bfloat16", kv_cache_dtype=dtype, max_model_len=spec["max_model_len"],
                       enforce_eager=True, max_num_seqs=16, kv_cache_memory_bytes=1 << 30,
                       distributed_executor_backend="uni", max_logprobs=spec["top_k"])
        if folder is not None:
            loaded_record(folder)  # the plugin rewrote every layer, else this arm measures nothing
    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=spec["top_k"], detokenize=False)
    outs = llm.generate([{"prompt_token_ids": t} for t in spec["chunks"]], params, use_tqdm=False)
    rows = []
    for toks, o in zip(spec["chunks"], outs):
        ids, lps, own = [], [], []
        for pos in range(1, len(toks)):
            ranked = sorted(o.prompt_logprobs[pos].items(), key=lambda kv: kv[1].logprob, reverse=True)
            ids.append([int(t) for t, _ in ranked[: spec["top_k"]]])
            lps.append([float(lp.logprob) for _, lp in ranked[: spec["top_k"]]])
            own.append(float(o.prompt_logprobs[pos][toks[pos]].logprob))  # the scored token's own log-prob
        rows.append({"ids": ids, "lps": lps, "own": own})
    prov = kv_provenance(llm, on_cpu=device_kind() == "cpu")  # the backend vLLM's selector picked
    backend = (prov.attention_backend or "unknown").split(",") if prov is not None else ["unknown"]
    result.write_text(json.dumps({"rows": rows, "cache_dtype": str(llm.llm_engine.vllm_config.cache_config.cache_dtype),
                                  "backend": backend, "device": device_kind(), "kv": kv}))


def run_arm(arm: str, native: str, model: str, plain: str, scales: dict, chunks: list[list[int]], top_k: int,
            work: Path) -> tuple[Run, np.ndarray, dict]:
    """One arm in vLLM's interpreter: its Run, the scored tokens' log-probs and what the worker reported."""
    with tempfile.TemporaryDirectory(prefix="kv_native_") as tmp:
        job, res = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"arm": arm, "native": native, "model": model, "plain_model": plain,
                                   "scales": scales, "chunks": chunks, "top_k": top_k, "max_model_len": 2048}))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        name = "auto" if arm == "auto" else f"{arm}_{native}"
        with open(work / f"vllm_{name}.log", "wb") as log:
            subprocess.run([vllm_python(), "-m", MODULE, "--worker", str(job), str(res)], check=True, env=env,
                           stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        data = json.loads(res.read_text())
    run = Run([np.array(r["ids"]) for r in data["rows"]], [np.array(r["lps"]) for r in data["rows"]])
    own = np.concatenate([np.array(r["own"]) for r in data["rows"]])
    return run, own, {k: data[k] for k in ("cache_dtype", "backend", "device", "kv")}


def table(result: dict) -> str:
    """TABLE.md of a native run."""
    lines = ["# Native KV cache against the qa_kv plugin's emulation of it\n",
             (f"`benchmarks/kv_fidelity_native.py`: {result['chunks']} WikiText-2 chunks x <= {result['max_tokens']} "
             f"tokens (seed {result['seed']}), top-{result['top_k']}, model `{result['model']}`, scales "
             f"{result['scales']}, {result['wall_seconds']:.0f} s. KL in nats/token over the first arm's top-k + "
             "tail, 95% CI clustered by chunk; ratio = KL(auto || plugin) / KL(auto || native), 95% paired "
             "bootstrap CI over chunks."
             + (f" The auto and plugin arms load `{result['plain_model']}` (the same weights without the K/V "
                "scheme)." if result.get("plain_model") else "") + "\n"),
             ("| native cache | backend, device | plugin spec | KL(native \\|\\| plugin) | top-1 agr. | max \\|dlogp\\| "
             "| KL(auto \\|\\| native) | KL(auto \\|\\| plugin) | ratio (95% CI) | [0.8, 1.25] |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        d, n, p = r["native_vs_plugin"], r["auto_vs_native"], r["auto_vs_plugin"]
        kv = ", ".join(f"{k}={v}" for k, v in r["plugin"]["kv"].items())
        lines.append(f"| {r['native']} | {'/'.join(r['native_info']['backend'])}, {r['native_info']['device']} | "
                     f"{kv} | {kl_cell(d)} | {100 * d['top1_agreement']:.1f}% | {r['max_abs_logprob_diff']:.4f} | "
                     f"{kl_cell(n)} | {kl_cell(p)} | {r['ratio']:.2f} [{r['ratio_ci95'][0]:.2f}, "
                     f"{r['ratio_ci95'][1]:.2f}] | {r['target']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Run the baseline, each native dtype and its emulation on the same chunks; write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--native", default="nvfp4", help=f"comma list of native kv_cache_dtypes: {', '.join(EMULATED)}")
    p.add_argument("--model", default="smollm2-135m", help="a model name or folder (its K/V scales, if any, used)")
    p.add_argument("--plain-model", default=None,
                   help="the same weights without a KV scheme, for the auto and plugin arms (needed when --model "
                        "carries K/V scales: vLLM would quantize an auto cache with them)")
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.worker:
        worker(*ns.worker)
        return
    natives = [x.strip() for x in ns.native.split(",") if x.strip()]
    bad = next((x for x in natives if x not in EMULATED), None) if natives else "(none)"
    problem = f"--native {bad!r}: choose from {', '.join(EMULATED)}" if bad else None
    if min(ns.chunks, ns.max_tokens, ns.top_k) < 1:
        problem = "--chunks, --max-tokens and --top-k must be positive"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    t0 = time.time()
    model = resolve_model(ns.model)
    path = Path(model.path)
    folder = path.is_dir() and has_kv_scales(path)
    scales = {"scales": str(path)} if folder else {"scales": "constant", "constant_scale": 1.0}
    if folder and ns.plain_model is None:
        print(f"error: --model {ns.model} carries K/V scales: give --plain-model (the same weights without them)",
              file=sys.stderr)
        raise SystemExit(2)
    plain = str(resolve_model(ns.plain_model).path) if ns.plain_model else str(path)
    ns.out.mkdir(parents=True, exist_ok=True)
    work = ns.out / "logs"
    work.mkdir(exist_ok=True)
    chunks = chunk_tokens(ns.chunks, ns.max_tokens, ns.seed)
    print(f"{len(chunks)} chunks, {sum(len(c) - 1 for c in chunks)} scored tokens", flush=True)
    auto, _, _ = run_arm("auto", "auto", str(path), plain, scales, chunks, ns.top_k, work)
    rows = []
    for native in natives:
        nat, nat_own, nat_info = run_arm("native", native, str(path), plain, scales, chunks, ns.top_k, work)
        emu, emu_own, emu_info = run_arm("plugin", native, str(path), plain, scales, chunks, ns.top_k, work)
        if folder:  # the folder by its name in the committed files: no machine path
            emu_info["kv"]["scales"] = path.name
        n, e = pair_stats(auto, nat), pair_stats(auto, emu)
        ratio, ci = ratio_ci(e["chunk_kl_sums"], n["chunk_kl_sums"], ns.seed)
        rows.append({"native": native, "native_info": nat_info, "plugin": emu_info,
                     "native_vs_plugin": pair_stats(nat, emu), "auto_vs_native": n, "auto_vs_plugin": e,
                     "max_abs_logprob_diff": float(np.abs(nat_own - emu_own).max()), "ratio": ratio,
                     "ratio_ci95": ci, "target": verdict(ci)})
        print(f"  {native}: KL(native || plugin) {rows[-1]['native_vs_plugin']['kl_mean']:.5f}", flush=True)
    for log in work.glob("*.log"):  # committed beside the table: no path of this machine
        text = portable_text(log.read_text(encoding="utf-8", errors="replace"), REPO)
        log.write_text(text.replace(str(path.parent), "<models>") if folder else text, encoding="utf-8")
    shown = path.name if Path(ns.model).is_dir() else ns.model  # a folder by its name: no machine path
    result = {"model": shown, "plain_model": ns.plain_model and Path(ns.plain_model).name, "scales": "the folder's (static)" if folder else "1.0 (vLLM's default)",
              "chunks": ns.chunks, "max_tokens": ns.max_tokens, "top_k": ns.top_k, "seed": ns.seed,
              "wall_seconds": round(time.time() - t0, 1), "rows": rows}
    atomic_write_text(ns.out / "fidelity_native.json", json.dumps(result, indent=1) + "\n")
    md = table(result)
    atomic_write_text(ns.out / "TABLE.md", md)
    print(md)


if __name__ == "__main__":
    try:
        main()
    except USER_ERRORS as exc:  # missing data, an unknown model: one line, exit 2
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
