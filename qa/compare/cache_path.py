"""Statistics of the cache path (the `sessions` probe): numbers only, `qa.gate.cache_path` decides.

Records (evals.run.sessions): item_id "s{NNN}/t{K}/{cold|warm|shuffled}", cluster = the session id,
meta {"session", "turn", "cache_path", "cached_tokens", "prompt_tokens"}, `reference_logprobs` = the
teacher-forced fixed continuation (the turn's reference answer). A unit is (session, turn, repeat);
each unit is served cold (no reusable prefix), warm (right after its prefix), and optionally again
"shuffled" (the cold prompts in another order and batch size: the batch-history A/A floor).

Per arm, warm against its own cold path: identical completions (Wilson interval on the effective n,
clustered by session, as `qa.compare.generation.rate_interval`), the first divergence as a character
offset into the completion, KL(cold || warm) per token on the continuation (`qa.compare.distribution`, CR1 by
session), score flips, the prefix-cache hit rate the engine reported (cached / prompt tokens), per turn
depth. Across arms: the candidate's warm-vs-cold KL minus the baseline's (CR1 by session), the
excess-flip sign test (`qa.compare.estimate.flip_excess`, the baseline's warm-vs-cold flips as the floor),
and accuracy and the reference-answer signal of the candidate's warm path against the baseline's cold path
(`qa.compare.estimate`, `qa.compare.reference`).
The standard per-task estimates of such a task use the cold path only (`standard_records`; the warm path of
a task served warm only). A task served on one path only has no cache-path estimate.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from evals.records.samples import SampleRecord
from qa.compare.distribution import distribution_estimates, token_stats
from qa.compare.estimate import estimate, flip_excess
from qa.compare.generation import rate_interval
from qa.compare.pairing import PairedTask, pair_records, paired_metric, score_keys
from qa.compare.reference import reference_estimate
from qa.errors import PairingError
from qa.files.comparison import (
    AgreementShare,
    CacheArm,
    CacheFloor,
    CacheKLDelta,
    CachePathEstimate,
    CacheTurn,
    DistributionEstimate,
    Estimate,
    ExcessFlips,
    Flips,
    ReferenceEstimate,
    StatsSettings,
)
from qa.stats.basic import cluster_mean_se, flips, gate_mean_se, t_interval

PATHS = ("cold", "warm", "shuffled")
Unit = tuple[str, int, int]  # (session, turn, repeat)
Paths = dict[str, dict[Unit, SampleRecord]]  # "cold" | "warm" | "shuffled{k}" -> unit -> record, one task of one arm
NOTE = ("per-task estimates of this task use the cold path only; first divergence is a character offset into "
        "the completion; KL is KL(cold || warm) per token of the fixed teacher-forced continuation")


def cache_path_of(record: SampleRecord) -> str | None:
    """The record's serving path ("cold", "warm", "shuffled"), None for a record of any other task."""
    path = record.meta.get("cache_path")
    return path if isinstance(path, str) else None


def standard_records(records: Iterable[SampleRecord]) -> tuple[SampleRecord, ...]:
    """The records the standard per-task estimates use: every record, but only one path of a cache-path task
    (its other paths serve the same turns again): the cold path, or the warm path of a task served warm only."""
    records = tuple(records)
    warm_only = {r.task for r in records if cache_path_of(r) == "warm"} - {
        r.task for r in records if cache_path_of(r) == "cold"}
    return tuple(r for r in records if cache_path_of(r) in (None, "cold")
                 or (cache_path_of(r) == "warm" and r.task in warm_only))


def first_divergence(a: str, b: str) -> int | None:
    """Character offset of the first difference of two completions (None: identical; a strict prefix
    differs at its end)."""
    return None if a == b else len(os.path.commonprefix([a, b]))


def _unit(r: SampleRecord) -> Unit:
    session, turn = r.meta.get("session"), r.meta.get("turn")
    if session is None or not isinstance(turn, int):
        raise PairingError(f"task {r.task}: record {r.item_id!r} has a cache_path but no meta session/turn; "
                           "re-run the sessions task with this toolkit version")
    return (str(session), turn, r.repeat)


def _by_path(records: Iterable[SampleRecord], arm: str) -> dict[str, Paths]:
    out: dict[str, Paths] = defaultdict(lambda: {"cold": {}, "warm": {}})
    for r in records:
        path = cache_path_of(r)
        if path is None:
            continue
        if path not in PATHS:
            raise PairingError(f"{arm} task {r.task}: record {r.item_id!r} has cache_path {path!r}; "
                               f"expected one of {', '.join(PATHS)}")
        if path == "shuffled":  # the k-th shuffled pass: item id ".../shuffled{k}" (k >= 2)
            path = r.item_id.rsplit("/", 1)[-1]
        unit = _unit(r)
        if unit in out[r.task].setdefault(path, {}):
            raise PairingError(f"{arm} task {r.task}: two {path} records of session {unit[0]} turn {unit[1]}; "
                               "the records folder mixes two runs")
        out[r.task][path][unit] = r
    return out


def _cluster(r: SampleRecord) -> str:
    return r.cluster if r.cluster is not None else str(r.meta.get("session"))


def _share(same: Sequence[bool], clusters: Sequence[str]) -> AgreementShare:
    values = np.asarray(same, dtype=np.float64)  # (m,) 1.0 where identical
    k, n = int(values.sum()), int(values.size)
    return AgreementShare(n=n, agree=k, share=k / n if n else 0.0,
                          ci95=rate_interval(values, np.asarray(clusters, dtype=str)))


def hit_rate(records: Iterable[SampleRecord]) -> tuple[int | None, int | None, float | None]:
    """(prompt tokens, cached tokens, cached / prompt) over the records that give both counts; Nones
    when no record does (the engine did not say)."""
    counts = [(r.meta.get("prompt_tokens"), r.meta.get("cached_tokens")) for r in records]
    known = [(p, c) for p, c in counts if isinstance(p, int) and isinstance(c, int)]
    if not known:
        return None, None, None
    prompt, cached = sum(p for p, _ in known), sum(c for _, c in known)
    return prompt, cached, cached / prompt if prompt else None


def _as_token(r: SampleRecord) -> SampleRecord:
    return r.model_copy(update={"token_logprobs": r.reference_logprobs})


def _kl(task: str, version: str, a: list[SampleRecord], b: list[SampleRecord]) -> dict[str, DistributionEstimate]:
    """kld, top1_agree, ... of b against a on the teacher-forced continuation (empty without log-probs)."""
    pt = PairedTask(task, version, tuple(_as_token(r) for r in a), tuple(_as_token(r) for r in b))
    return {d.metric: d for d in distribution_estimates(pt)}


def _flips(a: list[SampleRecord], b: list[SampleRecord]) -> dict[str, Flips]:
    """"metric,filter" -> flips of b against a (n10: a scored higher), over pairs scored in both."""
    out = {}
    for key in score_keys(PairedTask("", "", tuple(a), tuple(b))):
        pairs = [(x.scores.get(key), y.scores.get(key)) for x, y in zip(a, b, strict=True)]
        kept = np.array([p for p in pairs if None not in p], dtype=np.float64).reshape(-1, 2)  # (m, 2)
        if kept.shape[0]:
            out[key] = flips(kept[:, 0], kept[:, 1])
    return out


def _text(a: list[SampleRecord], b: list[SampleRecord]) -> tuple[AgreementShare, int, float | None]:
    """(identical completions, how many differ, median first-divergence offset in characters)."""
    both = [(x, y) for x, y in zip(a, b, strict=True) if x.completion is not None and y.completion is not None]
    offsets = [first_divergence(x.completion or "", y.completion or "") for x, y in both]
    diff = [o for o in offsets if o is not None]
    share = _share([o is None for o in offsets], [_cluster(x) for x, _ in both])
    return share, len(diff), float(np.median(diff)) if diff else None


def _turns(task: str, version: str, cold: list[SampleRecord], warm: list[SampleRecord],
           units: list[Unit]) -> list[CacheTurn]:
    out = []
    for turn in sorted({u[1] for u in units}):
        idx = [i for i, u in enumerate(units) if u[1] == turn]
        c, w = [cold[i] for i in idx], [warm[i] for i in idx]
        identical, _, offset = _text(c, w)
        kld = _kl(task, version, c, w).get("kld")
        out.append(CacheTurn(turn=turn, n=len(idx), hit_rate=hit_rate(w)[2], identical=identical,
                             first_divergence=offset, kld=kld.value if kld else None,
                             kld_ci95=kld.ci95 if kld else None, flips=_flips(c, w)))
    return out


def _same_topk(a: SampleRecord, b: SampleRecord) -> bool | None:
    x, y = a.reference_logprobs, b.reference_logprobs
    if x is None or y is None:
        return None
    return x.topk_ids == y.topk_ids and x.topk_logprobs == y.topk_logprobs


def floor_stats(task: str, version: str, paths: Paths) -> CacheFloor | None:
    """The batch-history A/A floor: every shuffled pass against the cold path on the units served both
    ways, pooled over the passes (None: no shuffled pass)."""
    pairs = [(paths["cold"][u], recs[u]) for name, recs in sorted(paths.items()) if name.startswith("shuffled")
             for u in sorted(set(paths["cold"]) & set(recs))]
    if not pairs:
        return None
    c, s = [a for a, _ in pairs], [b for _, b in pairs]
    identical, _, _ = _text(c, s)
    topk = [(t, _cluster(x)) for x, y in zip(c, s, strict=True) if (t := _same_topk(x, y)) is not None]
    kld = _kl(task, version, c, s).get("kld")
    return CacheFloor(n=len(pairs), identical_outputs=identical,
                      identical_topk=_share([t for t, _ in topk], [g for _, g in topk]) if topk else None,
                      kld=kld.value if kld else None)


def arm_stats(arm: str, task: str, paths: Paths) -> CacheArm | None:
    """One arm's warm path against its cold path (None: no unit was served both ways)."""
    units = sorted(set(paths["cold"]) & set(paths["warm"]))
    if not units:
        return None
    cold, warm = [paths["cold"][u] for u in units], [paths["warm"][u] for u in units]
    for c, w in zip(cold, warm, strict=True):
        if c.prompt_hash != w.prompt_hash:
            raise PairingError(f"{arm} task {task}: {c.item_id} and {w.item_id} have different prompts; "
                               "warm and cold must serve the same prompt")
    version = cold[0].task_version
    prompt, cached, rate = hit_rate(warm)
    identical, diverged, offset = _text(cold, warm)
    dist = _kl(task, version, cold, warm)
    return CacheArm(arm=arm, n=len(units), n_sessions=len({u[0] for u in units}), prompt_tokens=prompt,
                    cached_tokens=cached, hit_rate=rate, cold_hit_rate=hit_rate(cold)[2], identical=identical,
                    diverged=diverged, first_divergence=offset, kld=dist.get("kld"), top1_agree=dist.get("top1_agree"),
                    flips=_flips(cold, warm), per_turn=_turns(task, version, cold, warm, units),
                    floor=floor_stats(task, version, paths))


def _unit_kl(cold: SampleRecord, warm: SampleRecord) -> float | None:
    if cold.reference_logprobs is None or warm.reference_logprobs is None:
        return None
    kld = token_stats(cold.reference_logprobs, warm.reference_logprobs).kld  # (T,)
    return float(kld.mean()) if kld.size else None


def kl_delta(base: Paths, cand: Paths, units: list[Unit]) -> CacheKLDelta | None:
    """Candidate's mean KL(cold || warm) minus the baseline's over units with log-probs in all four
    records; CR1 by session (None: no such unit)."""
    rows = []
    for u in units:
        kb, kc = _unit_kl(base["cold"][u], base["warm"][u]), _unit_kl(cand["cold"][u], cand["warm"][u])
        if kb is not None and kc is not None:
            rows.append((kb, kc, _cluster(base["cold"][u])))
    if not rows:
        return None
    b = np.array([r[0] for r in rows])  # (n,) baseline per-unit KL
    c = np.array([r[1] for r in rows])  # (n,) candidate per-unit KL
    clusters = [r[2] for r in rows]
    delta, se, df, _ = gate_mean_se(c - b, clusters)
    ci90, ci95 = ((t_interval(delta, se, df, lvl) if se is not None else None) for lvl in (0.90, 0.95))
    return CacheKLDelta(n=len(rows), n_clusters=len(set(clusters)), mean_baseline=float(b.mean()),
                        mean_candidate=float(c.mean()), delta=delta, se=se, df=df if se is not None else None,
                        ci90=ci90, ci95=ci95)


def excess_cache_flips(base: Paths, cand: Paths, units: list[Unit], key: str) -> ExcessFlips | None:
    """Do the candidate's warm-vs-cold flips exceed the baseline's (the floor) on one "metric,filter"?"""
    rows = [(base["cold"][u], base["warm"][u], cand["cold"][u], cand["warm"][u]) for u in units]
    scored = [tuple(r.scores.get(key) for r in four) for four in rows]
    keep = [i for i, s in enumerate(scored) if None not in s]
    if not keep:
        return None
    s = np.array([scored[i] for i in keep], dtype=np.float64).reshape(-1, 4)  # (m, 4): base cold/warm, cand cold/warm
    clusters = [_cluster(rows[i][0]) for i in keep]
    aa_delta, aa_se, _ = cluster_mean_se(s[:, 1] - s[:, 0], clusters)  # the baseline's warm - cold
    return flip_excess(s[:, 3] != s[:, 2], s[:, 1] != s[:, 0], aa_delta, aa_delta / aa_se if aa_se else None)


def _rekeyed(records: Iterable[SampleRecord]) -> list[SampleRecord]:
    """The records with the path dropped from their item id ("s000/t2/warm" -> "s000/t2"), to pair paths."""
    return [r.model_copy(update={"item_id": r.item_id.rsplit("/", 1)[0]}) for r in records]


def _warm_vs_cold(base: Paths, cand: Paths, units: list[Unit]) -> list[PairedTask]:
    """The candidate's warm path paired with the baseline's cold path, unit by unit (what users get vs the baseline)."""
    return pair_records(_rekeyed(base["cold"][u] for u in units), _rekeyed(cand["warm"][u] for u in units))


def warm_accuracy(base: Paths, cand: Paths, units: list[Unit], settings: StatsSettings) -> list[Estimate]:
    """Per "metric,filter": the candidate's warm path against the baseline's cold path, the usual estimate."""
    pts = _warm_vs_cold(base, cand, units)
    return [estimate(paired_metric(pt, key), settings) for pt in pts for key in score_keys(pt)]


def warm_reference(base: Paths, cand: Paths, units: list[Unit]) -> ReferenceEstimate | None:
    """The reference-answer signal (qa.compare.reference) of the candidate's warm path against the baseline's
    cold path, on each turn's teacher-forced reference answer; None when no record carries one."""
    pts = _warm_vs_cold(base, cand, units)
    return reference_estimate(pts[0]) if pts else None


def cache_path_estimates(baseline: Sequence[SampleRecord], candidate: Sequence[SampleRecord],
                         settings: StatsSettings) -> list[CachePathEstimate]:
    """One CachePathEstimate per task whose records carry a cache path (none for other tasks)."""
    base_tasks, cand_tasks = _by_path(baseline, "baseline"), _by_path(candidate, "candidate")
    out = []
    for task in sorted(set(base_tasks) | set(cand_tasks)):
        base, cand = base_tasks.get(task), cand_tasks.get(task)
        if base is None or cand is None:
            which = "baseline" if base is None else "candidate"
            raise PairingError(f"task {task}: the {which} arm has no warm/cold records; run the sessions task in both arms")
        for path in ("cold", "warm"):
            if set(base[path]) != set(cand[path]):
                only = len(set(base[path]) ^ set(cand[path]))
                raise PairingError(f"task {task}: the arms' {path} paths differ on {only} (session, turn) units; "
                                   "finish or re-run the missing sessions in both arms")
        if not (base["cold"] and base["warm"]) and not (cand["cold"] and cand["warm"]):
            continue  # served on one path only (an agentic task's `paths`): nothing to compare warm with
        arm_b, arm_c = arm_stats(_arm_name(baseline, task), task, base), arm_stats(_arm_name(candidate, task), task, cand)
        if arm_b is None or arm_c is None:
            raise PairingError(f"task {task}: no turn was served both cold and warm; run its warm and cold paths")
        units = sorted(set(base["cold"]) & set(base["warm"]))
        keys = sorted(set(arm_b.flips) | set(arm_c.flips))
        excess = {k: e for k in keys if (e := excess_cache_flips(base, cand, units, k)) is not None}
        out.append(CachePathEstimate(task=task, baseline=arm_b, candidate=arm_c, kld=kl_delta(base, cand, units),
                                     excess_flips=excess, accuracy=warm_accuracy(base, cand, units, settings),
                                     warm_reference=warm_reference(base, cand, units), notes=[NOTE]))
    return out


def _arm_name(records: Sequence[SampleRecord], task: str) -> str:
    return next((r.arm for r in records if r.task == task), "")
