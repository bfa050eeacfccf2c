"""Hand-made agentic records (the evals.run.sessions format with the agentic task's meta) for the slice
statistics and report tests: 4 sessions x 2 turns (a tool call, then a look-up), served cold and warm, the
continuation a 3-position distribution over two tokens (top-2 = the whole support: the top-k KL is exact)."""

from __future__ import annotations

import math

from evals.engines.base import TokenLogprobs
from evals.records.samples import SampleRecord, sha256_text

KEY = "exact_match,strict-match"


def ref(p: float, n: int = 3, flip_at: int | None = None) -> TokenLogprobs:
    """n positions over tokens {5, 6}, token 5 the target with probability p (top-1), except at `flip_at`
    where token 6 is top-1 with probability p."""
    ids = [[6, 5] if t == flip_at else [5, 6] for t in range(n)]
    lps = [[math.log(p), math.log(1 - p)] for _ in range(n)]
    tgt = [math.log(1 - p) if t == flip_at else math.log(p) for t in range(n)]
    return TokenLogprobs(target_ids=[5] * n, target_logprobs=tgt, topk_ids=ids, topk_logprobs=lps)


def rec(arm: str, s: int, t: int, path: str, score: float, completion: str = "ok", *, kind: str = "tool",
        parsed: bool | None = True, p: float = 0.8, flip_at: int | None = None, cached: int = 0,
        prompt: int = 1500) -> SampleRecord:
    sid = f"s{s:03d}"
    meta = {"session": sid, "turn": t, "cache_path": path, "kind": kind, "prompt_tokens": prompt,
            "cached_tokens": cached}
    if parsed is not None:
        meta["tool_parsed"] = parsed
    return SampleRecord(task="agentic", task_version="1", arm=arm, item_id=f"{sid}/t{t}/{path}", cluster=sid,
                        prompt_hash=sha256_text(f"{sid}/{t}"), target="x", completion=completion, output_tokens=4,
                        scores={KEY: score}, reference_logprobs=ref(p, flip_at=flip_at), meta=meta)


def arm(name: str, flips: dict[tuple[int, int], float] | None = None, **changes: object) -> list[SampleRecord]:
    """4 sessions x 2 turns (turn 1 a tool call, turn 2 a look-up), cold and warm; baseline score 1 on turn 1."""
    out = []
    for s in range(4):
        for t in (1, 2):
            score = (flips or {}).get((s, t), 1.0 if t == 1 else 0.0)
            kind = "tool" if t == 1 else "lookup"
            extra = {k: v for k, v in changes.items() if (s, t) in v}  # type: ignore[operator]
            completion = str(extra["text"][(s, t)]) if "text" in extra else "[f(a=1)]"  # type: ignore[index]
            p = float(extra["p"][(s, t)]) if "p" in extra else 0.8  # type: ignore[index]
            flip = int(extra["flip"][(s, t)]) if "flip" in extra else None  # type: ignore[index]
            for path in ("cold", "warm"):
                out.append(rec(name, s, t, path, score, completion, kind=kind, parsed=(kind == "tool") or None,
                               p=p, flip_at=flip, cached=1024 if path == "warm" else 0, prompt=1500 + 2000 * (t - 1)))
    return out
