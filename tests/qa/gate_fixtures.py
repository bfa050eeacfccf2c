"""Synthetic `Estimate`s and `Comparison`s for the gate and report tests, built from explicit
per-item scores with textbook formulas (independent of qa.stats)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps
from statsmodels.stats.proportion import proportion_confint

from evals.records.samples import SampleRecord, write_records
from qa.files.comparison import (
    Agreement,
    AgreementShare,
    ChunkValue,
    Comparison,
    DistributionEstimate,
    Estimate,
    Flips,
    Interval,
    McNemar,
    save_comparison,
)


def _wilson(k: int, n: int) -> Interval:
    lo, hi = proportion_confint(k, n, alpha=0.05, method="wilson") if n else (0.0, 1.0)
    return Interval(lower=float(lo), upper=float(hi))


def _t_ci(delta: float, se: float, df: int, level: float) -> Interval:
    half = float(sps.t.ppf(0.5 + level / 2, df)) * se
    return Interval(lower=delta - half, upper=delta + half)


def estimate_from_scores(
    task: str,
    base: list[float] | np.ndarray,
    cand: list[float] | np.ndarray,
    *,
    metric: str = "acc",
    filter: str = "none",
    errors: tuple[int, int] = (0, 0),
    agreement: Agreement | None = None,
) -> Estimate:
    """An Estimate for one repeat per item with a paired-t CI (ddof = 1, n - 1 df), or, when every
    difference is equal, the exact binomial bound 1 - a^(1/n) times the score range 1."""
    a = np.asarray(base, dtype=float)
    b = np.asarray(cand, dtype=float)
    n = len(a)
    d = b - a
    se_a = float(a.std(ddof=1) / np.sqrt(n))
    se_b = float(b.std(ddof=1) / np.sqrt(n))
    se_p = float(d.std(ddof=1) / np.sqrt(n))
    delta = float(d.mean())
    binary = bool(np.isin(a, (0, 1)).all() and np.isin(b, (0, 1)).all())
    if se_p > 0:
        method, ci90, ci95 = "paired_t", _t_ci(delta, se_p, n - 1, 0.90), _t_ci(delta, se_p, n - 1, 0.95)
    else:
        method = "degenerate"
        h90, h95 = 1 - 0.05 ** (1 / n), 1 - 0.025 ** (1 / n)
        ci90 = Interval(lower=delta - h90 * (delta + 1), upper=delta + h90 * (1 - delta))
        ci95 = Interval(lower=delta - h95 * (delta + 1), upper=delta + h95 * (1 - delta))
    rho = float(np.corrcoef(a, b)[0, 1]) if se_a > 0 and se_b > 0 else None
    n10 = int((d < 0).sum())
    n01 = int((d > 0).sum())
    flips = Flips(
        n=n,
        n10=n10,
        n01=n01,
        rate=(n10 + n01) / n,
        ci95=_wilson(n10 + n01, n),
        regress_rate=n10 / n,
        regress_ci95=_wilson(n10, n),
        improve_rate=n01 / n,
        improve_ci95=_wilson(n01, n),
    )
    p_exact = float(sps.binomtest(n10, n10 + n01).pvalue) if n10 + n01 else 1.0
    return Estimate(
        task=task,
        metric=metric,
        filter=filter,
        binary=binary,
        n=n,
        repeats=1,
        n_clusters=n,
        n_errors_baseline=errors[0],
        n_errors_candidate=errors[1],
        n_dropped_items=0,
        mean_baseline=float(a.mean()),
        mean_candidate=float(b.mean()),
        delta=delta,
        sd_baseline=float(a.std(ddof=1)),
        sd_candidate=float(b.std(ddof=1)),
        se_baseline=se_a,
        se_candidate=se_b,
        se_unpaired=float(np.hypot(se_a, se_b)),
        se_paired=se_p,
        sd_diff=float(d.std(ddof=1)),
        df=n - 1,
        rho=rho,
        items_worse=n10,
        items_better=n01,
        ci_method=method,
        ci90=ci90,
        ci95=ci95,
        mcnemar=McNemar(n10=n10, n01=n01, p_exact=p_exact, p_midp=p_exact) if binary else None,
        flips=flips,
        agreement=agreement,
    )


def agreement(n: int, same_extracted: int, same_completion: int) -> Agreement:
    """Answer agreement shares with Wilson intervals."""
    return Agreement(
        extracted=AgreementShare(
            n=n, agree=same_extracted, share=same_extracted / n, ci95=_wilson(same_extracted, n)
        ),
        completion=AgreementShare(
            n=n, agree=same_completion, share=same_completion / n, ci95=_wilson(same_completion, n)
        ),
    )


def scores(n: int, n_right_both: int, n10: int, n01: int) -> tuple[np.ndarray, np.ndarray]:
    """Binary per-item scores with the given concordant-right count and discordant counts."""
    a = np.zeros(n)
    b = np.zeros(n)
    a[:n_right_both] = b[:n_right_both] = 1
    a[n_right_both : n_right_both + n10] = 1
    b[n_right_both + n10 : n_right_both + n10 + n01] = 1
    return a, b


def comparison(*estimates: Estimate, distribution: list[DistributionEstimate] | None = None) -> Comparison:
    """A Comparison of the given estimates, arms named baseline / candidate."""
    return Comparison(
        baseline="baseline",
        candidate="candidate",
        estimates=list(estimates),
        distribution=distribution or [],
    )


def kld(value: float = 0.012, se: float = 0.002) -> DistributionEstimate:
    """A KL-divergence distribution estimate with hand-picked numbers."""
    return DistributionEstimate(
        task="wikitext",
        metric="kld",
        n_tokens=40960,
        n_chunks=40,
        value=value,
        se=se,
        se_naive=se / 8,
        ci95=Interval(lower=value - 1.96 * se, upper=value + 1.96 * se),
        p99=0.15,
        p999=0.6,
        max=1.9,
    )


def make_run_dir(run: Path, *, kv: bool = True) -> Path:
    """A run directory with comparison.json (arc pass, mmlu fail, gpqa underpowered, gsm8k at the
    floor), records with hostile completions, GPQA records with secret-looking text, KL
    per-chunk values, env.json and spec.toml with a secret, and optionally kv_inspect.json."""
    run.mkdir(parents=True, exist_ok=True)
    a, b = scores(1172, 700, 25, 21)
    arc = estimate_from_scores("arc_challenge", a, b)
    a, b = scores(1000, 600, 60, 15)
    mmlu = estimate_from_scores("mmlu", a, b)
    a, b = scores(198, 60, 14, 9)
    gpqa = estimate_from_scores("gpqa_diamond_zeroshot", a, b)
    gsm = estimate_from_scores(
        "gsm8k",
        [0] * 250,
        [0] * 250,
        metric="exact_match",
        filter="strict-match",
        agreement=agreement(250, 201, 88),
    )
    values = np.random.default_rng(0).gamma(2.0, 0.006, 40)
    dist = kld().model_copy(
        update={
            "per_chunk": [
                ChunkValue(chunk=f"c{i}", n_tokens=1024, value=float(v)) for i, v in enumerate(values)
            ]
        }
    )
    save_comparison(run / "comparison.json", comparison(arc, mmlu, gpqa, gsm, distribution=[dist]))
    recs: dict[str, list[SampleRecord]] = {"baseline": [], "candidate": []}

    def add(key: dict[str, str], baseline: dict[str, Any], candidate: dict[str, Any]) -> None:
        recs["baseline"].append(SampleRecord(arm="baseline", **key, **baseline))
        recs["candidate"].append(SampleRecord(arm="candidate", **key, **candidate))

    for i in range(6):
        add(
            _key("gsm8k", "3", f"gsm8k-{i}", "x", "42"),
            {
                "completion": f"The answer is {i} <b>bold</b>",
                "extracted": {"strict-match": str(i)},
                "scores": {"exact_match,strict-match": 0.0},
            },
            {
                "completion": HOSTILE_COMPLETION,
                "extracted": {"strict-match": HOSTILE_ANSWER},
                "scores": {"exact_match,strict-match": 0.0},
            },
        )
    for i in range(12):
        add(
            _key("mmlu", "1", f"mmlu-{i}", "y", "B"),
            {"choice_loglikelihoods": [-1.0, -0.5, -2, -3], "scores": {"acc,none": 1.0}},
            {"choice_loglikelihoods": [-0.4, -0.5, -2, -3], "scores": {"acc,none": 0.0 if i < 8 else 1.0}},
        )
    for i in range(5):
        add(
            _key("gpqa_diamond_zeroshot", "1", f"rec{i:05d}", "z", GPQA_SECRET),
            {"completion": GPQA_SECRET, "scores": {"acc,none": 1.0}},
            {"completion": GPQA_SECRET, "scores": {"acc,none": 0.0}},
        )
    for arm, rs in recs.items():
        for task in ("gsm8k", "mmlu", "gpqa_diamond_zeroshot"):
            write_records(run / "records" / arm / f"{task}.jsonl", [r for r in rs if r.task == task])
    if kv:
        layers = [{"layer": i, "k_sqnr_db": 18.0 + i % 5, "v_sqnr_db": 20.0 - i % 3} for i in range(24)]
        (run / "kv_inspect.json").write_text(json.dumps({"layers": layers}))
    env = {
        "git_sha": "abc123",
        "torch": "2.13.0",
        "hardware": {"cpu": "x86_64"},
        "server": {"api_key": SECRET_KEY_VALUE},
    }
    (run / "env.json").write_text(json.dumps(env))
    (run / "spec.toml").write_text(
        f'name = "t"\nmodel = "<script>m</script>"\napi_key = "{SECRET_KEY_VALUE}"\n'
    )
    return run


def _key(task: str, version: str, item_id: str, hash_char: str, target: str) -> dict[str, str]:
    return {
        "task": task,
        "task_version": version,
        "item_id": item_id,
        "prompt_hash": hash_char * 64,
        "target": target,
    }


HOSTILE_COMPLETION = "<script>alert('pwned')</script> & 7"
HOSTILE_ANSWER = "<img src=x onerror=alert(1)>"
GPQA_SECRET = "GPQA-QUESTION-TEXT-MUST-NOT-LEAK"
SECRET_KEY_VALUE = "sk-do-not-print"
