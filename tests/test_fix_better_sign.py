"""scripts/fix_better_sign.py: an estimate of a lower-is-better metric as the code wrote it before its counts
followed the metric's direction (what the same code writes for a higher-is-better metric, whose counts are by
sign, without the `higher_is_better` field) becomes, field for field, what qa.compare.estimate writes now;
a second run changes nothing, the run folder's files that name the comparison's sha256 name the new one, and
no comparison.json under reports/ is left with the old counts."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from qa.files.comparison import Comparison
from scripts.fix_better_sign import MARKER, dumped, fix, fix_file
from tests.qa.compare.test_estimate import _keyed

ROOT = Path(__file__).resolve().parents[1]
BASE = [1.0] * 6 + [0.0] * 2 + [1.0] * 4 + [0.0] * 8  # binary: McNemar and Tango are computed
CAND = [0.0] * 6 + [1.0] * 2 + [1.0] * 4 + [0.0] * 8  # 1 -> 0 on 6 items, 0 -> 1 on 2
NLL_BASE = [2.0, 2.1, 1.9, 2.2, 2.0, 1.8, 2.3, 2.05]
NLL_CAND = [2.3, 2.4, 1.8, 2.5, 2.3, 2.1, 2.6, 2.35]  # higher on 7 items, lower on 1


def _as_written_before(a: list[float], b: list[float], metric: str) -> dict[str, object]:
    """The estimate of `metric` as written before the fix: counted by sign, as a higher-is-better metric's
    still is, and without the direction field."""
    by_sign = _keyed(a, b, "acc,none").model_dump(mode="json")
    assert by_sign.pop(MARKER) is True
    return {**by_sign, "metric": metric.partition(",")[0]}


@pytest.mark.parametrize(("a", "b", "metric"), [(BASE, CAND, "truncated,none"), (NLL_BASE, NLL_CAND, "nll,none")])
def test_an_old_estimate_becomes_what_the_code_writes_now(a: list[float], b: list[float], metric: str) -> None:
    now = {**_keyed(a, b, metric).model_dump(mode="json"), "metric": metric.partition(",")[0]}
    old = _as_written_before(a, b, metric)
    assert old["items_better"] != now["items_better"]  # the reversed counts this fixes
    changed: list[str] = []
    fixed = fix({"estimates": [old]}, "", changed)
    assert changed == [f".estimates[0] ({metric.partition(',')[0]})"]
    assert fixed == {"estimates": [now]}
    assert list(fixed["estimates"][0]) == list(now)  # the field order the schema writes, too
    again: list[str] = []
    assert fix(fixed, "", again) == fixed and again == []  # idempotent


def test_a_higher_is_better_estimate_is_left_as_it_is() -> None:
    acc = _as_written_before(BASE, CAND, "acc,none")  # no direction field, but counted right by sign
    changed: list[str] = []
    assert fix({"estimates": [acc]}, "", changed) == {"estimates": [acc]} and changed == []


def test_a_run_folder_is_fixed_in_place_with_the_sha256_its_files_name(tmp_path: Path) -> None:
    committed = ROOT / "reports" / "sequential" / "items_to_verdict" / "candidates" / "corrupt_1pct"
    run = shutil.copytree(committed, tmp_path / "corrupt_1pct")
    comparison = run / "comparison.json"
    doc = json.loads(comparison.read_bytes())
    nll = doc["estimates"][0]
    assert nll["metric"] == "nll" and nll["items_better"] == 0 and nll["items_worse"] == 200  # fixed in reports/
    nll.pop(MARKER)  # as the run wrote it: NLL 2.29 nats higher on all 200 items, counted "better"
    nll["items_better"], nll["items_worse"] = 200, 0
    flips = nll["flips"]
    flips["n10"], flips["n01"] = flips["n01"], flips["n10"]
    flips["regress_rate"], flips["improve_rate"] = flips["improve_rate"], flips["regress_rate"]
    flips["regress_ci95"], flips["improve_ci95"] = flips["improve_ci95"], flips["regress_ci95"]
    comparison.write_bytes(dumped(doc))
    old_sha, new_sha = (hashlib.sha256(p.read_bytes()).hexdigest() for p in (comparison, committed / "comparison.json"))
    for name in ("verdict.json", "report.md"):  # as the run wrote them: naming the old bytes
        (run / name).write_text((committed / name).read_text().replace(new_sha, old_sha))
    assert fix_file(comparison) == [".estimates[0] (nll)"]
    assert comparison.read_bytes() == (committed / "comparison.json").read_bytes()
    for name in ("verdict.json", "report.md"):
        assert (run / name).read_text() == (committed / name).read_text()
    est = Comparison.model_validate_json(comparison.read_bytes()).estimates[0]
    assert (est.items_worse, est.items_better, est.higher_is_better, est.items_by_sign()) == (200, 0, False, (200, 0))
    assert fix_file(comparison) == []  # a second run: nothing to do
    assert comparison.read_bytes() == (committed / "comparison.json").read_bytes()


def test_no_committed_comparison_keeps_the_old_counts() -> None:
    reports = ROOT / "reports"
    for path in sorted(reports.rglob("comparison.json")):
        if "withdrawn" in path.relative_to(reports).parts:
            continue
        changed: list[str] = []
        fix(json.loads(path.read_bytes()), "", changed)
        assert changed == [], f"{path}: run python -m scripts.fix_better_sign"
