"""Hand-made sessions records (the evals.run.sessions format) for the cache-path statistics, gate and
report tests: item_id "s{NNN}/t{K}/{path}", cluster = session, meta session/turn/cache_path/token counts,
reference_logprobs a one-position distribution over two tokens (top-2 = the whole support, so the
top-k KL is the exact KL)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from evals.engines.base import TokenLogprobs
from evals.records.samples import SampleRecord, sha256_text

TASK = "sessions"
KEY = "exact_match,none"


@dataclass(frozen=True)
class Served:
    """One path of one unit: what the engine returned and how many prompt tokens came from its cache."""

    completion: str
    score: float
    p: float  # probability of token 5 at the continuation's one position (token 6 has 1 - p)
    cached: int | None = 0
    prompt: int | None = 100


def ref(p: float) -> TokenLogprobs:
    """A one-position continuation over tokens {5, 6}, token 5 the target; ids in descending order."""
    ids, lps = ([5, 6], [math.log(p), math.log(1 - p)]) if p >= 0.5 else ([6, 5], [math.log(1 - p), math.log(p)])
    return TokenLogprobs(target_ids=[5], target_logprobs=[math.log(p)], topk_ids=[ids], topk_logprobs=[lps])


def record(arm: str, session: int, turn: int, path: str, s: Served) -> SampleRecord:
    """One sessions record of `arm` for (session, turn) served on `path`."""
    sid = f"s{session:03d}"
    return SampleRecord(
        task=TASK, task_version="1", arm=arm, item_id=f"{sid}/t{turn}/{path}", cluster=sid,
        prompt_hash=sha256_text(f"{sid}/{turn}"), target="42", target_hash=sha256_text("42"),
        completion=s.completion, extracted={"none": s.completion}, scores={KEY: s.score},
        reference_logprobs=ref(s.p),
        meta={"session": sid, "turn": turn, "cache_path": path, "cached_tokens": s.cached, "prompt_tokens": s.prompt},
    )


def arm_records(arm: str, units: dict[tuple[int, int], dict[str, Served]]) -> list[SampleRecord]:
    """Every record of an arm: units maps (session, turn) -> path -> what was served."""
    return [record(arm, s, t, path, served) for (s, t), paths in sorted(units.items()) for path, served in paths.items()]


def same_everywhere(arm: str, sessions: int = 3, turns: int = 2, cached: int = 60) -> list[SampleRecord]:
    """An arm whose warm (and shuffled) path returns exactly its cold path, warm turns after the first hitting
    `cached` of 100 prompt tokens."""
    units = {}
    for s in range(sessions):
        for t in range(1, turns + 1):
            cold = Served(f"answer {s} {t}", float((s + t) % 2), 0.8)
            units[(s, t)] = {"cold": cold, "warm": Served(cold.completion, cold.score, cold.p, cached if t > 1 else 0),
                             "shuffled": cold}
    return arm_records(arm, units)


def sessions_arm(arm: str, sessions: int = 6, turns: int = 2, *, flipped: frozenset[tuple[int, int]] = frozenset(),
                 warm_p: float = 0.8, cached: int | None = 60, shuffle: bool = True) -> list[SampleRecord]:
    """An arm whose cold path scores (session + turn) % 2 with p = 0.8; its warm path equals it except that
    the `flipped` units answer wrongly (score flipped), the continuation has p = warm_p, and warm turns after
    the first read `cached` of 100 prompt tokens from the cache (None: the engine did not say)."""
    units = {}
    for s in range(sessions):
        for t in range(1, turns + 1):
            cold = Served(f"answer {s} {t}", float((s + t) % 2), 0.8, 0, 100)
            score = 1 - cold.score if (s, t) in flipped else cold.score
            text = "wrong" if (s, t) in flipped else cold.completion
            hit = None if cached is None else (cached if t > 1 else 0)
            warm = Served(text, score, warm_p, hit, None if cached is None else 100)
            units[(s, t)] = {"cold": cold, "warm": warm} | ({"shuffled": cold} if shuffle else {})
    return arm_records(arm, units)
