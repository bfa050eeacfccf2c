"""Per-slice tables (comparison.json `slices`, qa.files.slices): for a task whose records say where each item
sits, the candidate against the baseline, and the baseline rerun against the baseline (the A/A control),
per turn depth, per context length and per kind of turn (or subtask). Numbers only.

Where a record sits, from its meta: turn depth "turn" (bucketed 1, 2, 3-4, 5-8, 9-16, 17-32, 33+); context
length "length" (a task's nominal length, e.g. ruler's: "L4096"), else the engine's "prompt_tokens" bucketed
by powers of two ("2K-4K"); kind "kind" (agentic), "ask" (sessions) or "subtask" (ruler). A unit is one
paired (item, repeat); for a session task (records with a cache path) its turns on the primary path (cold
when served, else warm: `primary_path`), the slice read off the baseline's record.

Per row: accuracy of both arms and delta = arm - baseline with a 95% t interval, SE CR1 over the units'
clusters (sessions; an item without a cluster is its own); tool-call validity (meta "tool_parsed": the output
decodes as calls) in both arms; identical completions; the first divergence of the arm's greedy completion
from the baseline's as a character offset (median over the units that differ) and in tokens, estimated as
that offset times the baseline completion's output tokens per character; the share of units whose fixed
teacher-forced continuation (reference_logprobs) has a position where the arms' top-1 tokens differ, and
the median first such position (exact, in tokens); the mean per unit of KL(baseline || arm) per token on
that continuation (qa.compare.distribution.token_stats, top-k + tail) with its CR1 interval; and for a
session task the arm's own warm path in that slice: hit rate (cached / prompt tokens) and the share of
warm completions equal to its cold ones.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from evals.records.samples import SampleRecord
from qa.compare.cache_path import cache_path_of, first_divergence, hit_rate
from qa.compare.distribution import token_stats
from qa.compare.pairing import pair_records, score_keys
from qa.errors import PairingError
from qa.files.estimates import Interval
from qa.files.slices import SliceDimension, SliceRow, SliceTable
from qa.stats.basic import gate_mean_se, t_interval

Pair = tuple[SampleRecord, SampleRecord]  # (baseline, arm)
TURN_BUCKETS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32))
KIND_KEYS = ("kind", "ask", "subtask")
NOTE = ("delta = arm - baseline per unit, 95% t interval CR1 over clusters; first divergence in tokens is "
        "estimated from characters; top-1 positions and KL are on the fixed teacher-forced continuation")


def turn_bucket(turn: int) -> tuple[str, int]:
    """A turn depth's bucket label and sort key: 1, 2, 3-4, 5-8, 9-16, 17-32, 33+."""
    for lo, hi in TURN_BUCKETS:
        if lo <= turn <= hi:
            return (str(lo) if lo == hi else f"{lo}-{hi}"), lo
    return "33+", 33


def length_bucket(tokens: int) -> tuple[str, int]:
    """A prompt length's power-of-two bucket: "<1K", "1K-2K", ..., "16K-32K", ">=32K"."""
    if tokens < 1024:
        return "<1K", 0
    k = 1024
    while k * 2 <= tokens and k < 32768:
        k *= 2
    return (f"{k // 1024}K-{2 * k // 1024}K" if k < 32768 else ">=32K"), k


def slice_of(record: SampleRecord, dimension: SliceDimension) -> tuple[str, int] | None:
    """(label, sort key) of the record's slice along `dimension`, None when its meta does not say."""
    meta = record.meta
    if dimension == "turn":
        turn = meta.get("turn")
        return turn_bucket(turn) if isinstance(turn, int) and not isinstance(turn, bool) else None
    if dimension == "length":
        length, tokens = meta.get("length"), meta.get("prompt_tokens")
        if isinstance(length, int) and not isinstance(length, bool):
            return f"L{length}", length
        return length_bucket(tokens) if isinstance(tokens, int) and not isinstance(tokens, bool) else None
    kind = next((meta[k] for k in KIND_KEYS if isinstance(meta.get(k), str)), None)
    return (str(kind), 0) if kind is not None else None


def primary_path(records: Iterable[SampleRecord]) -> str | None:
    """The path a session task's units are compared on: "cold" when any record has it, else "warm"; None for a
    task without cache paths."""
    paths = {cache_path_of(r) for r in records} - {None}
    if not paths:
        return None
    return "cold" if "cold" in paths else "warm"


def _unit_key(r: SampleRecord) -> tuple[str, int]:
    return (r.item_id.rsplit("/", 1)[0], r.repeat)


def _cluster(r: SampleRecord) -> str:
    return r.cluster if r.cluster is not None else f"item:{r.item_id}"


def _interval(x: np.ndarray, clusters: list[str]) -> tuple[float, float | None, Interval | None]:
    mean, se, df, _ = gate_mean_se(x, clusters)
    return mean, se, t_interval(mean, se, df, 0.95) if se is not None else None


def _share(flags: list[bool]) -> float | None:
    return float(np.mean(flags)) if flags else None


def _divergence(pairs: Sequence[Pair]) -> tuple[float | None, float | None, float | None]:
    """(share identical, median first-difference offset in characters, the same in estimated tokens)."""
    both = [(b, a) for b, a in pairs if b.completion is not None and a.completion is not None]
    offsets = [(first_divergence(b.completion or "", a.completion or ""), b) for b, a in both]
    diff = [(o, b) for o, b in offsets if o is not None]
    if not both:
        return None, None, None
    chars = float(np.median([o for o, _ in diff])) if diff else None
    per_char = [o * (b.output_tokens or 0) / len(b.completion or " ") for o, b in diff if b.output_tokens]
    return _share([o is None for o, _ in offsets]), chars, float(np.median(per_char)) if per_char else None


def _continuation(pairs: Sequence[Pair]) -> tuple[float | None, float | None, float | None, Interval | None]:
    """(share with a top-1 difference, median first such position, mean KL per unit, its CR1 interval)."""
    kls, clusters, firsts, diverged = [], [], [], []
    for b, a in pairs:
        if b.reference_logprobs is None or a.reference_logprobs is None or not b.reference_logprobs.target_ids:
            continue
        try:
            ts = token_stats(b.reference_logprobs, a.reference_logprobs)
        except PairingError:  # another tokenizer: no position to compare
            continue
        kls.append(float(ts.kld.mean()))
        clusters.append(_cluster(b))
        off = np.flatnonzero(ts.top1_agree == 0.0)  # positions whose top-1 tokens differ
        diverged.append(bool(off.size))
        if off.size:
            firsts.append(int(off[0]))
    if not kls:
        return None, None, None, None
    kl, _, ci = _interval(np.asarray(kls), clusters)
    return _share(diverged), float(np.median(firsts)) if firsts else None, kl, ci


def _warm(pairs: Sequence[Pair], warm: dict[tuple[str, int], SampleRecord],
          cold: dict[tuple[str, int], SampleRecord]) -> tuple[float | None, float | None]:
    """The arm's warm path on the slice's units: (hit rate, share of warm completions equal to cold)."""
    keys = [_unit_key(a) for _, a in pairs]
    served = [warm[k] for k in keys if k in warm]
    same = [warm[k].completion == cold[k].completion for k in keys if k in warm and k in cold]
    return (hit_rate(served)[2] if served else None), _share(same)


def slice_row(value: tuple[str, int], arm: str, role: str, pairs: Sequence[Pair], key: str,
              warm: dict[tuple[str, int], SampleRecord], cold: dict[tuple[str, int], SampleRecord]) -> SliceRow:
    """One row (module doc) of one slice's (baseline, arm) pairs on one "metric,filter"."""
    scored = [(b, a) for b, a in pairs if b.scores.get(key) is not None and a.scores.get(key) is not None]
    clusters = [_cluster(b) for b, _ in scored]
    fields: dict[str, object] = {}
    if scored:
        xb = np.array([b.scores[key] for b, _ in scored], dtype=np.float64)  # (n,)
        xa = np.array([a.scores[key] for _, a in scored], dtype=np.float64)  # (n,)
        delta, se, ci = _interval(xa - xb, clusters)
        fields = {"mean_baseline": float(xb.mean()), "mean_arm": float(xa.mean()), "delta": delta, "se": se, "ci95": ci}
    tools = [(b, a) for b, a in pairs if isinstance(b.meta.get("tool_parsed"), bool)
             and isinstance(a.meta.get("tool_parsed"), bool)]
    identical, chars, tokens = _divergence(pairs)
    diverged, first, kld, kld_ci = _continuation(pairs)
    hit, same = _warm(pairs, warm, cold)
    return SliceRow(value=value[0], order=value[1], arm=arm, role=role, n=len(scored),  # type: ignore[arg-type]
                    n_clusters=len(set(clusters)), tool_n=len(tools),
                    valid_baseline=_share([bool(b.meta["tool_parsed"]) for b, _ in tools]),
                    valid_arm=_share([bool(a.meta["tool_parsed"]) for _, a in tools]), identical=identical,
                    first_divergence_chars=chars, first_divergence_tokens=tokens, top1_diverged=diverged,
                    top1_first_position=first, kld=kld, kld_ci95=kld_ci, warm_hit_rate=hit, warm_identical=same,
                    **fields)  # type: ignore[arg-type]


def _path_maps(records: Sequence[SampleRecord], path: str) -> dict[tuple[str, int], SampleRecord]:
    return {_unit_key(r): r for r in records if cache_path_of(r) == path}


def _by_task(records: Iterable[SampleRecord]) -> dict[str, list[SampleRecord]]:
    out: dict[str, list[SampleRecord]] = defaultdict(list)
    for r in records:
        out[r.task].append(r)
    return out


def has_slices(records: Sequence[SampleRecord]) -> bool:
    """True when the task's records say a turn depth, a nominal length or a kind."""
    return any("turn" in r.meta or "length" in r.meta or any(k in r.meta for k in KIND_KEYS) for r in records)


def task_slices(task: str, base: Sequence[SampleRecord], arms: Sequence[tuple[str, str, Sequence[SampleRecord]]]
                ) -> list[SliceTable]:
    """The tables of one task: `arms` = (label, role, records) of the candidate and the rerun."""
    path = primary_path(base)

    def keep(rs: Sequence[SampleRecord]) -> list[SampleRecord]:
        return [r for r in rs if path is None or cache_path_of(r) == path]

    paired = []
    for label, role, records in arms:
        [pt] = pair_records(keep(base), keep(records))  # one task; PairingError when the arms cannot pair
        paired.append((label, role, pt, _path_maps(records, "warm"), _path_maps(records, "cold")))
    out = []
    keys = sorted({k for _, _, pt, _, _ in paired for k in score_keys(pt)})
    for dimension in ("turn", "length", "kind"):
        for key in keys:
            rows = []
            for label, role, pt, warm, cold in paired:
                groups: dict[tuple[str, int], list[Pair]] = defaultdict(list)
                for b, a in zip(pt.baseline, pt.candidate, strict=True):
                    where = slice_of(b, dimension)  # type: ignore[arg-type]
                    if where is not None:
                        groups[where].append((b, a))
                rows += [slice_row(v, label, role, groups[v], key, warm, cold) for v in groups]
            if rows:
                order = {v: i for i, v in enumerate(dict.fromkeys(r.value for r in rows))}  # first seen (kinds)
                rows.sort(key=lambda r: (r.order, order[r.value], r.role != "candidate"))
                out.append(SliceTable(task=task, dimension=dimension, metric=key, path=path, rows=rows,  # type: ignore[arg-type]
                                      notes=[NOTE]))
    return out


def slice_tables(baseline: Sequence[SampleRecord], candidate: tuple[str, Sequence[SampleRecord]],
                 rerun: tuple[str, Sequence[SampleRecord]] | None = None) -> list[SliceTable]:
    """Every task's tables whose records have slices (module doc); `candidate` and `rerun` are (label, records)."""
    base = _by_task(baseline)
    cand = _by_task(candidate[1])
    again = _by_task(rerun[1]) if rerun is not None else {}
    out = []
    for task in sorted(base):
        if task not in cand or not has_slices(base[task]):
            continue
        arms = [(candidate[0], "candidate", cand[task])]
        if task in again:
            arms.append((rerun[0], "rerun", again[task]))  # type: ignore[index]
        out.extend(task_slices(task, base[task], arms))
    return out

