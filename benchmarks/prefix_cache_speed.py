"""The hf engine's prefix cache, warm vs cold, side by side: wall time, hit rate and how far the warm
path's outputs are from the cold path's, per KV spec (format none and NVFP4 + an FP8 recent window,
bounded replay off and on).

Sessions are multi-turn chats built from GSM8K (the model's chat template): the first user turn is a
few-shot block of training problems with their solutions and a question, every later turn a new
question; assistant turns are the reference solutions, so every prompt is fixed text and turn k's
prompt extends turn k-1's prompt + reference. Per turn: a greedy generation and the teacher-forced
reference given the prompt. Cold: the prefix cache reset before each request. Warm: turns in order
without a reset (turn k after turn k-1's teacher-forced pass: a hit). Printed per spec: hit rate of the
warm path (hit / queried tokens, the engine's counters), identical greedy text share, share of turns
whose teacher-forced log-probs are identical, max |delta log-prob| of the reference tokens, and the
cold / warm wall-time ratio.

Usage: python -m benchmarks.prefix_cache_speed [--data-dir DIR] [--sessions 2] [--turns 3] [--shots 3]
       [--max-tokens 32] [--block 64] [--kv none nvfp4+fp8w128] [--replay 0 128] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from evals.engines import build_engine
from evals.engines.base import GenerateRequest, GenerateResult, TokenLogprobs, TokenLogprobsRequest
from evals.models.resolve import resolve_model

SPECS: dict[str, dict[str, Any]] = {
    "none": {"format": "none"},
    "nvfp4+fp8w128": {"format": "nvfp4", "recent_window": 128, "recent_format": "fp8_e4m3"},
}
REPLAY = (0,)  # SmolLM2 has no sliding-window layer: the engine refuses a replay there


def sessions(data_dir: Path, tokenizer: Any, n: int, turns: int, shots: int) -> list[list[tuple[str, str]]]:
    """Per session, (rendered prompt, reference answer) per turn; turn k's prompt extends turn k-1's."""
    train = [json.loads(x) for x in (data_dir / "gsm8k" / "train.jsonl").read_text().splitlines()]
    test = [json.loads(x) for x in (data_dir / "gsm8k" / "test.jsonl").read_text().splitlines()]
    out = []
    for s in range(n):
        block = "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in train[s * shots:(s + 1) * shots])
        messages: list[dict[str, str]] = []
        turns_out = []
        for k in range(turns):
            row = test[s * turns + k]
            q = f"Question: {row['question']}\nAnswer:"
            messages.append({"role": "user", "content": (block + q) if k == 0 else q})
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            turns_out.append((prompt, row["answer"]))
            messages.append({"role": "assistant", "content": row["answer"]})
        out.append(turns_out)
    return out


def serve(engine: Any, session: list[tuple[str, str]], max_tokens: int, cold: bool) -> list[tuple[Any, Any]]:
    """Each turn's generation and teacher-forced reference, cold (reset before each) or warm (in order)."""
    out = []
    if not cold:
        engine.reset_prefix_cache()
    for prompt, ref in session:
        if cold:
            engine.reset_prefix_cache()
        gen = engine.generate([GenerateRequest(prompt=prompt, max_tokens=max_tokens, until=("<|im_end|>",))])[0]
        if cold:
            engine.reset_prefix_cache()
        tf = engine.token_logprobs([TokenLogprobsRequest(text=ref, context=prompt, top_k=5)])[0]
        out.append((gen, tf))
        print(f"  {'cold' if cold else 'warm'} turn {len(out)}: {getattr(gen, 'cached_tokens', None)} of "
              f"{getattr(gen, 'prompt_tokens', None)} prompt tokens cached", file=sys.stderr, flush=True)
    return out


def compare(warm: list[tuple[Any, Any]], cold: list[tuple[Any, Any]]) -> dict[str, float]:
    """Identical text share, identical teacher-forced share, max |delta log-prob| over the references."""
    same_text = same_tf = 0
    worst = 0.0
    for (wg, wt), (cg, ct) in zip(warm, cold, strict=True):
        assert isinstance(wg, GenerateResult) and isinstance(cg, GenerateResult), (wg, cg)
        assert isinstance(wt, TokenLogprobs) and isinstance(ct, TokenLogprobs), (wt, ct)
        same_text += wg.text == cg.text
        same_tf += wt == ct
        worst = max(worst, max(abs(a - b) for a, b in zip(wt.target_logprobs, ct.target_logprobs, strict=True)))
    n = len(warm)
    return {"identical_text": same_text / n, "identical_teacher_forced": same_tf / n, "max_abs_dlogprob": worst}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=Path(os.environ.get("QA_DATA_DIR", "../shared/data")))
    ap.add_argument("--sessions", type=int, default=2)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--shots", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--kv", nargs="+", choices=list(SPECS), default=list(SPECS))
    ap.add_argument("--replay", nargs="+", type=int, default=list(REPLAY))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    model = resolve_model("smollm2-135m")
    rows = []
    for name in a.kv:
        kv = SPECS[name]
        for replay in a.replay:
            spec = {**kv, "prefix_cache": {"block": a.block, "replay_window": replay}}
            engine = build_engine("hf", model, {"kv": spec})
            data = sessions(a.data_dir, engine.tokenizer, a.sessions, a.turns, a.shots)
            times = {"warm": 0.0, "cold": 0.0}
            warm_all, cold_all = [], []
            before = engine.prefix_cache_stats()
            for session in data:
                t0 = time.perf_counter()
                warm_all += serve(engine, session, a.max_tokens, cold=False)
                times["warm"] += time.perf_counter() - t0
            after = engine.prefix_cache_stats()
            for session in data:
                t0 = time.perf_counter()
                cold_all += serve(engine, session, a.max_tokens, cold=True)
                times["cold"] += time.perf_counter() - t0
            engine.close()
            row = {"kv": name, "replay_window": replay, "turns": len(warm_all),
                   "warm_hit_rate": (after.hit_tokens - before.hit_tokens) / (after.queried_tokens - before.queried_tokens),
                   **compare(warm_all, cold_all), "cold_over_warm_time": times["cold"] / times["warm"]}
            rows.append(row)
            print(" | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
