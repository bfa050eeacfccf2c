"""Batch invariance on hand-made records: which items change between concurrency 1 and N per arm, the paired
difference and its intervals (checked by hand and against Tango's score equation written out here), the rule
against the policy's margin, and the report row."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats
from typer.testing import CliRunner

from evals.engines.base import TokenLogprobs
from evals.records.samples import SampleRecord, write_records
from qa.cli.main import app
from qa.compare.batch_invariance import INVARIANCE_FILE, BatchInvariance, LoadArms, batch_invariance
from qa.errors import QAError
from qa.files.policy import parse_policy
from qa.files.verdict import Verdict
from qa.gate.batch_invariance import apply_invariance, decide_invariance, decide_task
from qa.report.batch_invariance import invariance_row

ARMS = ("base1", "baseN", "cand1", "candN")


def rec(arm: str, item: str, score: float, ref: float | None = None, *, error: str | None = None) -> SampleRecord:
    lp = None if ref is None else TokenLogprobs(target_ids=[5], target_logprobs=[ref], topk_ids=[[5]], topk_logprobs=[[ref]])
    return SampleRecord(task="t", task_version="1", arm=arm, item_id=item, prompt_hash="h",
                        scores={} if error else {"acc,none": score}, extracted={} if error else {"a": str(score)},
                        error=error, reference_logprobs=lp)


def write(tmp: Path, rows: dict[str, list[SampleRecord]]) -> LoadArms:
    for arm, recs in rows.items():
        (tmp / arm).mkdir(parents=True)
        write_records(tmp / arm / "t.jsonl", recs)
    return LoadArms(*(tmp / a for a in ARMS))


def tango_t(n01: int, n10: int, n: int, d: float) -> float:
    """Tango's score statistic (Fagerland et al. 2014, eq. 9), written out independently of qa.stats."""
    a, b, c = 2.0 * n, -n01 - n10 + (2.0 * n - n01 + n10) * d, -n10 * d * (1 - d)
    p21 = (math.sqrt(b * b - 4 * a * c) - b) / (2 * a)
    return (n01 - n10 - n * d) / math.sqrt(n * (2 * p21 + d * (1 - d)))


def test_changed_items_rates_and_intervals(tmp_path: Path) -> None:
    items = "abcd"
    # baseline: item a's outcome moves under load; candidate: a, b and c move (c by failing)
    base_shift, cand_shift = [0.0, 0.1, 0.0, 0.1], [0.1, 0.4, 0.2, 0.1]  # |ref log-prob change| per item
    rows = {
        "base1": [rec("base1", i, 1.0, -1.0) for i in items],
        "baseN": [rec("baseN", i, 0.0 if i == "a" else 1.0, -1.0 - s) for i, s in zip(items, base_shift)],
        "cand1": [rec("cand1", i, 1.0, -1.0) for i in items],
        "candN": [rec("candN", i, 0.0 if i in "ab" else 1.0, -1.0 + s, error="engine: x" if i == "c" else None)
                  for i, s in zip(items, cand_shift)],
    }
    inv = batch_invariance(write(tmp_path, rows), out=tmp_path)
    (row,) = inv.tasks
    assert (row.n, row.baseline_changed, row.candidate_changed, row.n01, row.n10) == (4, 1, 3, 2, 0)
    assert (row.baseline_rate, row.candidate_rate, row.delta) == (0.25, 0.75, 0.5)
    assert row.changed_items == {"baseline": ["a#0"], "candidate": ["a#0", "b#0", "c#0"]}
    # Tango's 95% limits are where the score statistic equals -/+ z_0.975
    z = stats.norm.ppf(0.975)
    assert tango_t(2, 0, 4, row.ci95.lower) == pytest.approx(z, abs=1e-6)
    assert tango_t(2, 0, 4, row.ci95.upper) == pytest.approx(-z, abs=1e-6)
    assert row.ci90.lower > row.ci95.lower and row.ci90.upper < row.ci95.upper
    # reference shift: d = |cand| - |base| = [0.1, 0.3, 0.2, 0.0] -> mean 0.15, sd sqrt(0.05/3), t_{3,0.975} = 3.182446
    ref = row.reference
    assert ref is not None and ref.n == 4
    assert (ref.baseline, ref.candidate, ref.delta) == pytest.approx((0.05, 0.2, 0.15))
    half = 3.182446305284263 * math.sqrt(0.05 / 3) / 2
    assert ref.ci95 is not None and (ref.ci95.lower, ref.ci95.upper) == pytest.approx((0.15 - half, 0.15 + half))
    assert BatchInvariance.load(tmp_path / INVARIANCE_FILE) == inv


def _many(tmp: Path, n: int, base_changed: set[int], cand_changed: set[int]) -> BatchInvariance:
    ids = [f"i{k:03d}" for k in range(n)]
    rows = {a: [rec(a, i, 0.0 if (a == "baseN" and k in base_changed) or (a == "candN" and k in cand_changed) else 1.0)
                for k, i in enumerate(ids)] for a in ARMS}
    return batch_invariance(write(tmp, rows))


POLICY = "[default]\nbatch_invariance_margin = 0.05\n"


def test_rule_passes_fails_or_only_reports(tmp_path: Path) -> None:
    same = _many(tmp_path / "same", 100, {1, 2, 3}, {1, 2, 3})  # the same 3 items move in both arms
    worse = _many(tmp_path / "worse", 100, {1}, set(range(41)))  # the candidate moves 40 more
    gated = parse_policy(POLICY)
    (d,) = decide_invariance(same, gated)
    # 0 discordant of 100: the 90% upper limit solves T = -z_0.95 (about z^2 / (n + z^2) = 0.026 < 0.05)
    assert d.status == "pass" and d.ci.upper == pytest.approx(0.0263, abs=2e-3)
    assert tango_t(0, 0, 100, d.ci.upper) == pytest.approx(-stats.norm.ppf(0.95), abs=1e-6)
    (w,) = decide_invariance(worse, gated)
    assert w.delta == pytest.approx(0.40) and w.status == "fail" and w.ci.lower > 0.05
    reported = decide_task(worse.tasks[0], None, 0.05)
    assert reported.status == "reported" and "reported only" in reported.reason
    cells = invariance_row(worse.tasks[0], w)
    assert cells[:4] == ["t", "100", "1 (1.0%)", "41 (41.0%)"] and cells[-1] == "fail (margin +0.050)"


def test_policy_margin_is_validated() -> None:
    with pytest.raises(Exception, match="batch_invariance_margin"):
        parse_policy("[default]\nbatch_invariance_margin = 2.0\n")


def test_missing_folder_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(QAError, match="no such records folder"):
        batch_invariance(LoadArms(*(tmp_path / a for a in ARMS)))


def test_the_gate_applies_deciding_rules_only(tmp_path: Path) -> None:
    same = _many(tmp_path / "same", 100, {1, 2, 3}, {1, 2, 3})
    worse = _many(tmp_path / "worse", 100, {1}, set(range(41)))
    passing = Verdict(status="pass", summary="PASS: all 1 task(s) pass", baseline="b", candidate="c",
                      sign_convention="candidate - baseline", tasks=[], policy=parse_policy(POLICY), policy_sha256="x")
    assert apply_invariance(passing, decide_invariance(same, parse_policy(POLICY))) == passing
    failed = apply_invariance(passing, decide_invariance(worse, parse_policy(POLICY)))
    assert failed.status == "fail" and failed.exit_code == 1 and failed.summary.startswith("FAIL: batch invariance t fail")
    reported = apply_invariance(passing, decide_invariance(worse, parse_policy("[default]\n")))  # no margin
    assert reported == passing


def test_cli_writes_the_file_and_refuses_one_folder_twice(tmp_path: Path) -> None:
    for run, (b, c) in {"alone": ("base1", "cand1"), "loaded": ("baseN", "candN")}.items():
        for arm, src in (("baseline", b), ("candidate", c)):
            folder = tmp_path / run / "records" / arm
            folder.mkdir(parents=True)
            write_records(folder / "t.jsonl", [rec(src, i, 1.0 if src != "candN" or i != "a" else 0.0) for i in "abcd"])
    runner = CliRunner()
    ok = runner.invoke(app, ["invariance", str(tmp_path / "alone"), str(tmp_path / "loaded")])
    assert ok.exit_code == 0, ok.output
    assert "candidate 1/4" in ok.output and (tmp_path / "loaded" / INVARIANCE_FILE).is_file()
    same = subprocess.run([sys.executable, "-m", "qa.cli", "invariance", str(tmp_path / "alone"), str(tmp_path / "alone")],
                          capture_output=True, text=True, check=False)
    assert same.returncode == 2 and same.stderr.strip().count("\n") == 0 and "given twice" in same.stderr
