"""qa.compare.slices on hand-made records: buckets, per-slice accuracy deltas with their CR1 intervals (checked
against hand-computed values and statsmodels), tool-call validity, first divergence in characters and estimated
tokens, the first top-1 difference on the fixed continuation, KL, the warm path's hit rate, the A/A row beside
the candidate's, the primary path of a session task, and comparison.json carrying the tables."""

from __future__ import annotations

import math

import numpy as np
import pytest
import statsmodels.api as sm

from qa.compare.arms import Arm, compare_arms
from qa.compare.cache_path import standard_records
from qa.compare.slices import length_bucket, primary_path, slice_of, slice_tables, turn_bucket
from qa.files.comparison import Comparison, StatsSettings, load_comparison, save_comparison
from tests.qa.compare.slices_fixtures import KEY, arm, rec


def table(tables: list, dimension: str) -> list:
    return next(t for t in tables if t.dimension == dimension and t.metric == KEY).rows


def test_buckets_and_slices_read_off_meta() -> None:
    assert [turn_bucket(t)[0] for t in (1, 2, 3, 4, 5, 8, 9, 17, 32, 40)] == [
        "1", "2", "3-4", "3-4", "5-8", "5-8", "9-16", "17-32", "17-32", "33+"]
    assert [length_bucket(n)[0] for n in (100, 1024, 2047, 2048, 5000, 9000, 20000, 40000)] == [
        "<1K", "1K-2K", "1K-2K", "2K-4K", "4K-8K", "8K-16K", "16K-32K", ">=32K"]
    r = rec("b", 0, 3, "cold", 1.0)
    assert slice_of(r, "turn") == ("3-4", 3) and slice_of(r, "length") == ("1K-2K", 1024)
    assert slice_of(r, "kind") == ("tool", 0)
    ruler = r.model_copy(update={"meta": {"length": 4096, "subtask": "vt"}})
    assert slice_of(ruler, "length") == ("L4096", 4096) and slice_of(ruler, "kind") == ("vt", 0)
    assert slice_of(ruler, "turn") is None


def test_per_turn_delta_and_its_cr1_interval_match_statsmodels() -> None:
    base = arm("baseline")
    cand = arm("candidate", flips={(0, 1): 0.0, (1, 1): 0.0})  # two tool turns lost
    rows = table(slice_tables(base, ("candidate", cand)), "turn")
    assert [(r.value, r.role) for r in rows] == [("1", "candidate"), ("2", "candidate")]
    first = rows[0]
    assert (first.n, first.n_clusters, first.mean_baseline, first.mean_arm) == (4, 4, 1.0, 0.5)
    d = np.array([-1.0, -1.0, 0.0, 0.0])
    ols = sm.OLS(d, np.ones((4, 1))).fit()  # one unit per cluster: CR1 = the plain SE, 3 df
    assert first.delta == pytest.approx(-0.5) and first.se == pytest.approx(float(ols.bse[0]))
    lo, hi = ols.conf_int(0.05)[0]
    assert (first.ci95.lower, first.ci95.upper) == (pytest.approx(lo), pytest.approx(hi))
    assert rows[1].delta == 0.0 and rows[1].tool_n == 0 and rows[1].valid_baseline is None
    assert first.tool_n == 4 and first.valid_baseline == 1.0 == first.valid_arm


def test_divergence_top1_position_kl_and_warm_columns() -> None:
    base = arm("baseline")
    cand = arm("candidate", text={(0, 1): "[f(a=2)]"}, p={(1, 1): 0.6}, flip={(2, 1): 1})
    row = table(slice_tables(base, ("candidate", cand)), "turn")[0]
    assert row.identical == 0.75 and row.first_divergence_chars == 5.0  # "[f(a=" is shared
    assert row.first_divergence_tokens == pytest.approx(5 * 4 / len("[f(a=1)]"))
    assert row.top1_diverged == 0.25 and row.top1_first_position == 1.0
    kl = 0.8 * math.log(0.8 / 0.6) + 0.2 * math.log(0.2 / 0.4)
    flipped = (2 * 0 + (0.8 * math.log(0.8 / 0.2) + 0.2 * math.log(0.2 / 0.8))) / 3
    assert row.kld == pytest.approx((kl + flipped) / 4)
    assert row.warm_hit_rate == pytest.approx(1024 / 1500) and row.warm_identical == 1.0


def test_the_aa_row_sits_beside_the_candidates_at_each_depth() -> None:
    base, cand, again = arm("baseline"), arm("candidate", flips={(0, 1): 0.0}), arm("baseline-rerun")
    rows = table(slice_tables(base, ("candidate", cand), ("baseline-rerun", again)), "length")
    assert [(r.value, r.role, r.arm) for r in rows] == [
        ("1K-2K", "candidate", "candidate"), ("1K-2K", "rerun", "baseline-rerun"),
        ("2K-4K", "candidate", "candidate"), ("2K-4K", "rerun", "baseline-rerun")]
    assert rows[0].delta == -0.25 and rows[1].delta == 0.0 and rows[1].identical == 1.0 and rows[1].kld == 0.0
    kinds = table(slice_tables(base, ("candidate", cand)), "kind")
    assert [r.value for r in kinds] == ["tool", "lookup"]


def test_a_warm_only_task_is_compared_on_its_warm_path_and_tasks_without_meta_are_skipped() -> None:
    warm_b = [r for r in arm("baseline") if r.meta["cache_path"] == "warm"]
    warm_c = [r for r in arm("candidate", flips={(3, 2): 1.0}) if r.meta["cache_path"] == "warm"]
    assert primary_path(warm_b) == "warm" and primary_path(arm("baseline")) == "cold"
    tables = slice_tables(warm_b, ("candidate", warm_c))
    assert {t.path for t in tables} == {"warm"} and table(tables, "turn")[1].delta == 0.25
    assert len(standard_records(warm_b)) == 8 and len(standard_records(arm("baseline"))) == 8  # one path each
    plain = [r.model_copy(update={"meta": {}, "task": "gsm8k", "item_id": f"i{i}"}) for i, r in enumerate(warm_b)]
    assert slice_tables(plain, ("candidate", plain)) == []


def test_comparison_json_carries_the_tables(tmp_path) -> None:
    base, cand = arm("baseline"), arm("candidate", flips={(0, 1): 0.0})
    comparison = compare_arms(Arm("baseline", "records", tuple(base)), Arm("candidate", "records", tuple(cand)),
                              StatsSettings(bootstrap_n=0))
    assert {(t.dimension, t.metric) for t in comparison.slices} == {("turn", KEY), ("length", KEY), ("kind", KEY)}
    assert comparison.cache_path and comparison.estimates[0].n == 8  # cold path only in the per-task estimate
    save_comparison(tmp_path / "comparison.json", comparison)
    again = load_comparison(tmp_path / "comparison.json")
    assert isinstance(again, Comparison) and again.slices == comparison.slices
