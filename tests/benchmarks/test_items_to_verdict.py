"""benchmarks/items_to_verdict.py: the sequential replay over a finished run's records, on hand-made
records of a run directory (spec.toml + records/<arm>/), against the gate's own fixed-n verdict.

A destructive candidate must stop at the first look with the fixed-n verdict (fail); an identical one
must end with the same verdict as fixed n; bad options are one-line errors with exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import items_to_verdict as itv
from evals.records.samples import SampleRecord, write_records
from evals.run.selection import select_items
from evals.tasks.base import Item

N, SEED = 200, 7
ITEMS = [Item(item_id=f"q{i:03d}", doc={}) for i in range(N)]
SPEC = f"""\
name = "itv"
model = "smollm2-135m"
seed = {SEED}
policy = "policy.toml"
[arms.baseline]
engine = "hf"
[arms.broken]
engine = "hf"
[arms.same]
engine = "hf"
[[tasks]]
name = "arc_easy"
limit = {N}
"""
POLICY = """\
version = 1
name = "itv"
[default]
rules = ["noninferiority"]
margin = 0.10
min_n = 10
"""


def _records(arm: str, wrong: set[str]) -> list[SampleRecord]:
    return [SampleRecord(task="arc_easy", task_version="1", arm=arm, item_id=it.item_id, prompt_hash=f"h{it.item_id}",
                         scores={"acc,none": 0.0 if it.item_id in wrong else 1.0}) for it in ITEMS]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """Baseline right on 3 of 4 items; `broken` wrong on every item; `same` identical to the baseline."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.toml").write_text(SPEC)
    (run / "policy.toml").write_text(POLICY)
    base_wrong = {it.item_id for it in ITEMS[::4]}
    for arm, wrong in (("baseline", base_wrong), ("broken", {it.item_id for it in ITEMS}), ("same", base_wrong)):
        write_records(run / "records" / arm / "arc_easy.jsonl", _records(arm, wrong))
    return run


def test_a_destructive_candidate_stops_at_the_first_look_and_an_identical_one_keeps_its_verdict(run: Path) -> None:
    cases = {c.name: c for c in itv.load_cases(run, None)}
    assert set(cases) == {"itv/broken", "itv/same"}
    looks = (0.25, 0.5, 0.75, 1.0)
    for spending in ("obrien_fleming", "pocock", "confidence_sequence"):
        broken = itv.replay_task(itv.Replay(cases["itv/broken"], itv.StatsSettings(seed=SEED, bootstrap_n=0)),
                                 "arc_easy", spending, looks)
        assert (broken.fixed, broken.fixed_n) == ("fail", N)
        assert (broken.sequential, broken.look, broken.seq_n) == ("fail", 1, N // 4), spending
        assert broken.ratio == pytest.approx(0.25) and broken.time_share == pytest.approx(0.25)
        same = itv.replay_task(itv.Replay(cases["itv/same"], itv.StatsSettings(seed=SEED, bootstrap_n=0)),
                               "arc_easy", spending, looks)
        # identical: 0 differing items, the exact bound on the drop (1 - alpha^(1/n)) passes at fixed n
        # and at the first look whose n and adjusted alpha bring it under the margin
        assert (same.fixed, same.sequential) == ("pass", "pass"), spending
        assert same.seq_n == N * looks[same.look - 1]
        if spending == "pocock":  # look 1: n = 50 at a level near 0.02: 1 - 0.02^(1/50) = 7.5% < 10%
            assert same.look == 1 and same.ratio == pytest.approx(0.25)


def test_the_first_look_uses_the_runners_seeded_items(run: Path) -> None:
    case = next(c for c in itv.load_cases(run, None) if c.name == "itv/broken")
    rp = itv.Replay(case, itv.StatsSettings(seed=SEED, bootstrap_n=0))
    assert rp.first("arc_easy", 20) == {it.item_id for it in select_items(ITEMS, 20, SEED)}
    assert {e.n for e in rp.comparison("arc_easy", 20).estimates} == {20}


def test_main_prints_both_verdicts_and_the_summary(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert itv.main([str(run), "--spending", "pocock"]) == 0
    out = capsys.readouterr().out
    broken = next(line for line in out.splitlines() if line.startswith("itv/broken"))
    assert broken.split()[4:10] == ["FAIL", str(N), "FAIL", str(N // 4), "1/4", "0.25"]
    assert "pocock: same verdict in 2 of 2 cases" in out
    assert f"fixed-n FAIL itv/broken arc_easy: sequential FAIL at look 1 of 4 ({N // 4} of {N} items)" in out


@pytest.mark.parametrize("args, message", [
    (["--looks", "0.5,0.25,1"], "--looks '0.5,0.25,1'"),
    (["--looks", "a,b"], "write fractions separated by commas"),
    (["--spending", "obrian_fleming"], "--spending 'obrian_fleming'"),
])
def test_bad_options_are_one_line_errors(run: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                         message: str) -> None:
    assert itv.main([str(run), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_a_directory_without_a_spec_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert itv.main([str(tmp_path)]) == 2
    assert "no spec.toml" in capsys.readouterr().err
