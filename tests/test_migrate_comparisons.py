"""scripts/migrate_comparisons.py: a schema-1 comparison.json (tests/golden/comparison_v1_vllm_bf16_vs_fp8.json,
the bytes reports/engines/vllm_bf16_vs_fp8 held before the migration) becomes, byte for byte, the committed
current-schema file, with the sha256 its run folder names updated; a second run changes nothing; hand-computed
derivations of single estimates; what it refuses; and no comparison.json under reports/ is left in schema 1."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from qa.files.comparison import load_comparison
from scripts.fix_better_sign import NAME_THE_SHA
from scripts.migrate_comparisons import MigrateError, migrate_estimate, migrate_file, migrate_v1

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_V1 = ROOT / "tests" / "golden" / "comparison_v1_vllm_bf16_vs_fp8.json"
MIGRATED_RUN = ROOT / "reports" / "engines" / "vllm_bf16_vs_fp8"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _run_as_before(tmp_path: Path) -> Path:
    """A copy of the migrated run folder as it was before: the schema-1 comparison and files naming its sha256."""
    run = shutil.copytree(MIGRATED_RUN, tmp_path / "run")
    old, new = GOLDEN_V1.read_bytes(), (MIGRATED_RUN / "comparison.json").read_bytes()
    (run / "comparison.json").write_bytes(old)
    for name in NAME_THE_SHA:
        text = (MIGRATED_RUN / name).read_text(encoding="utf-8")
        assert _sha(new) in text
        (run / name).write_text(text.replace(_sha(new), _sha(old)), encoding="utf-8")
    return run


def test_a_schema_1_run_folder_becomes_the_committed_one(tmp_path: Path) -> None:
    run = _run_as_before(tmp_path)
    assert migrate_file(run / "comparison.json") is True
    for name in ("comparison.json", *NAME_THE_SHA):
        assert (run / name).read_bytes() == (MIGRATED_RUN / name).read_bytes(), name
    assert load_comparison(run).schema_version == 2
    assert migrate_file(run / "comparison.json") is False  # a second run: nothing to do
    for name in ("comparison.json", *NAME_THE_SHA):
        assert (run / name).read_bytes() == (MIGRATED_RUN / name).read_bytes(), name


def test_an_estimate_gets_what_schema_1_implies_and_loses_its_decisions() -> None:
    v1 = {"n": 100, "n_clusters": 100, "repeats": 1, "se_baseline": 0.05, "se_candidate": 0.0,
          "mean_baseline": 0.6, "mean_candidate": 0.5, "sigma_rule": {}, "tost": {}, "mde": 0.03,
          "mcnemar": {"n10": 12, "n01": 2, "p_exact": 0.01, "p_midp": 0.008, "unit": "item"},
          "notes": ["no information: ...", "the CI alone would pass, but MDE 0.03 > margin 0.02", "kept"]}
    out = migrate_estimate(v1)
    assert out["sd_baseline"] == pytest.approx(0.5)  # unclustered: se * sqrt(n) = 0.05 * 10
    assert out["sd_candidate"] == 0.0
    assert out["score_range"] == 1.0
    assert (out["items_worse"], out["items_better"]) == (12, 2)  # McNemar: n10 baseline right, candidate wrong
    assert out["mcnemar"]["method"] == "mcnemar"
    assert out["notes"] == ["kept"]
    assert not {"sigma_rule", "tost", "mde"} & set(out)


def test_clustered_or_repeated_estimates_leave_unknown_what_schema_1_cannot_give() -> None:
    clustered = migrate_estimate({"n": 50, "n_clusters": 27, "repeats": 1, "se_baseline": 0.2, "se_candidate": 0.0})
    assert (clustered["sd_baseline"], clustered["sd_candidate"]) == (None, 0.0)  # CR1 SE: per-item sd unknown
    repeated = migrate_estimate({"n": 20, "repeats": 3, "flips": {"n10": 4, "n01": 1}})
    assert "items_worse" not in repeated and "items_better" not in repeated  # several repeats: the counts are not per item


def test_settings_keep_only_numbers_not_policy() -> None:
    doc = migrate_v1({"schema_version": 1, "baseline": "b", "candidate": "c",
                      "settings": {"margin": 0.02, "alpha": 0.05, "bootstrap_n": 2000, "seed": 1}, "estimates": []})
    assert doc["schema_version"] == 2 and doc["settings"] == {"bootstrap_n": 2000, "seed": 1}


def test_a_file_still_counting_by_sign_is_refused_untouched(tmp_path: Path) -> None:
    doc = json.loads(GOLDEN_V1.read_bytes())
    nll = next(e for e in doc["estimates"] if e["metric"] == "nll")
    nll.pop("higher_is_better")  # as written before scripts/fix_better_sign.py
    path = tmp_path / "comparison.json"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    before = path.read_bytes()
    with pytest.raises(MigrateError, match="fix_better_sign"):
        migrate_file(path)
    assert path.read_bytes() == before


def test_no_comparison_under_reports_is_left_in_schema_1() -> None:
    reports = ROOT / "reports"
    for path in sorted(reports.rglob("comparison.json")):
        if path.relative_to(reports).parts[0] == "runs":  # local runs, not committed
            continue
        assert json.loads(path.read_bytes())["schema_version"] != 1, f"{path}: run python -m scripts.migrate_comparisons"
