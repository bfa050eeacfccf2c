"""evals.records.lmeval_import: lm-eval --log_samples folders -> SampleRecords (synthetic logs in lm-eval's format,
and one written by lm-eval's own EvaluationTracker)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from evals.errors import RecordError
from evals.records.lmeval_import import find_samples_files, import_lmeval, is_lmeval_folder
from evals.records.samples import sha256_text
from tests.evals.lmeval_fixtures import DATE, gen_lines, mc_lines, write_run


def test_multiple_choice_import(tmp_path: Path) -> None:
    write_run(tmp_path / "base", {"arc_easy": mc_lines([1, 0, 1])}, versions={"arc_easy": 1.0})
    recs = import_lmeval(tmp_path / "base")
    assert [r.item_id for r in recs] == ["0", "1", "2"]
    r0, r1 = recs[0], recs[1]
    assert r0.task == "arc_easy" and r0.task_version == "1.0" and r0.arm == "base" and r0.repeat == 0
    assert r0.scores == {"acc,none": 1.0, "acc_norm,none": 1.0}
    assert r1.scores["acc,none"] == 0.0
    assert r0.choice_loglikelihoods == pytest.approx([-1.0, -1.1, -1.2, -1.3])
    assert r0.choice_is_greedy == [True, False, False, False]
    assert r1.choice_is_greedy == [False, True, False, False]
    assert r0.prompt_hash == sha256_text("Question: question 0?\nAnswer:")
    assert r0.target == "0" and r0.target_hash == sha256_text("0")
    assert r0.completion is None and r0.extracted == {}
    assert r0.meta["source"] == "lm-eval" and len(str(r0.meta["doc_hash"])) == 64


def test_generative_filters_merge_into_one_record(tmp_path: Path) -> None:
    comps = ["so 12", "I think 7", "9"]
    write_run(tmp_path / "cand", {"gsm8k": gen_lines([1, 0, 0], [1, 1, 0], comps, ["12", "7", "3"])})
    recs = import_lmeval(tmp_path / "cand", arm="kv_nvfp4")
    assert len(recs) == 3
    r = recs[1]
    assert r.arm == "kv_nvfp4"
    assert r.scores == {"exact_match,strict-match": 0.0, "exact_match,flexible-extract": 1.0}
    assert r.extracted == {"strict-match": "[7]", "flexible-extract": "7"}
    assert r.completion == "I think 7"
    assert r.choice_loglikelihoods is None


def test_document_text_is_never_kept(tmp_path: Path) -> None:
    lines = mc_lines([1])
    lines[0]["doc"] = {"question": "SECRET-GPQA-TEXT"}
    write_run(tmp_path / "a", {"gpqa_diamond": lines})
    (r,) = import_lmeval(tmp_path / "a")
    assert "SECRET-GPQA-TEXT" not in r.model_dump_json()


def test_non_scalar_metrics_skipped_and_missing_version_unknown(tmp_path: Path) -> None:
    lines = mc_lines([1, 0])
    for line in lines:
        line["metrics"].append("bleu")
        line["bleu"] = [["ref"], ["pred"]]  # corpus-level metric: per-doc value is a pair
    write_run(tmp_path / "a", {"t": lines}, versions={})
    recs = import_lmeval(tmp_path / "a")
    assert set(recs[0].scores) == {"acc,none", "acc_norm,none"}
    assert recs[0].task_version == "unknown"


def test_latest_run_per_task_is_used(tmp_path: Path) -> None:
    write_run(tmp_path / "a", {"t": mc_lines([0, 0])}, date="2024-01-01T00-00-00.000001")
    write_run(tmp_path / "a", {"t": mc_lines([1, 1])}, date=DATE)
    assert len(find_samples_files(tmp_path / "a")) == 2
    recs = import_lmeval(tmp_path / "a")
    assert [r.scores["acc,none"] for r in recs] == [1.0, 1.0]


def test_task_names_with_underscores(tmp_path: Path) -> None:
    write_run(tmp_path / "a", {"mmlu_high_school_physics": mc_lines([1])})
    assert import_lmeval(tmp_path / "a")[0].task == "mmlu_high_school_physics"


def test_torn_last_line_dropped_corrupt_line_refused(tmp_path: Path) -> None:
    sub = write_run(tmp_path / "a", {"t": mc_lines([1, 0, 1])})
    path = sub / f"samples_t_{DATE}.jsonl"
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # cut the last line mid-write
    assert [r.item_id for r in import_lmeval(tmp_path / "a")] == ["0", "1"]
    path.write_text("{not json\n" + text)
    with pytest.raises(RecordError, match=r"samples_t_.*:1: not valid JSON"):
        import_lmeval(tmp_path / "a")


def test_duplicate_doc_filter_refused(tmp_path: Path) -> None:
    lines = mc_lines([1, 0])
    write_run(tmp_path / "a", {"t": lines + lines[:1]})
    with pytest.raises(RecordError, match="doc 0 filter none appears twice"):
        import_lmeval(tmp_path / "a")


def test_not_an_lmeval_folder(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    assert not is_lmeval_folder(tmp_path / "x")
    with pytest.raises(RecordError, match="no lm-eval samples"):
        import_lmeval(tmp_path / "x")
    with pytest.raises(RecordError, match="no such folder"):
        import_lmeval(tmp_path / "missing")


def test_two_model_folders_for_one_task_refused(tmp_path: Path) -> None:
    write_run(tmp_path / "a", {"t": mc_lines([1])}, model="org__m1")
    write_run(tmp_path / "a", {"t": mc_lines([1])}, model="org__m2")
    with pytest.raises(RecordError, match="2 model folders"):
        import_lmeval(tmp_path / "a")
    assert len(import_lmeval(tmp_path / "a" / "org__m1")) == 1


def test_reads_what_lm_eval_itself_writes(tmp_path: Path) -> None:
    """Samples serialised by lm-eval's own EvaluationTracker (sanitize_list, gen_args, str target)."""
    from lm_eval.loggers import EvaluationTracker

    ctx = "Q: 2+2?\nA:"
    mc = {
        "doc_id": 0, "doc": {"q": "2+2"}, "target": 1,
        "arguments": [(ctx, " 3"), (ctx, " 4")],
        "resps": [[(-2.5, False)], [(-0.25, True)]],
        "filtered_resps": [(-2.5, False), (-0.25, True)],
        "filter": "none", "metrics": ["acc"], "doc_hash": "d" * 64,
        "prompt_hash": sha256_text(ctx), "target_hash": sha256_text("1"), "acc": 1.0,
    }
    gen = [{
        "doc_id": 5, "doc": {"q": "x"}, "target": "4",
        "arguments": [(ctx, {"until": ["\n"], "do_sample": False})],
        "resps": [["The answer is 4"]], "filtered_resps": ["4" if f == "flex" else "[invalid]"],
        "filter": f, "metrics": ["exact_match"], "doc_hash": "e" * 64,
        "prompt_hash": sha256_text(ctx), "target_hash": sha256_text("4"), "exact_match": float(f == "flex"),
    } for f in ("strict", "flex")]
    tracker = EvaluationTracker(output_path=str(tmp_path / "run"))
    tracker.general_config_tracker.model_name_sanitized = "org__tiny"
    tracker.save_results_aggregated(results={"results": {}, "versions": {"mc": 2, "gen": 3}}, samples=None)
    tracker.save_results_samples("mc", [mc])
    tracker.save_results_samples("gen", gen)
    line = json.loads(next((tmp_path / "run" / "org__tiny").glob("samples_mc_*.jsonl")).read_text())
    assert line["filtered_resps"] == [["-2.5", "False"], ["-0.25", "True"]]  # lm-eval stringifies these
    recs = {r.task: r for r in import_lmeval(tmp_path / "run")}
    assert recs["mc"].choice_loglikelihoods == [-2.5, -0.25]
    assert recs["mc"].choice_is_greedy == [False, True]
    assert recs["mc"].task_version == "2" and recs["mc"].target == "1"
    assert recs["gen"].scores == {"exact_match,strict": 0.0, "exact_match,flex": 1.0}
    assert recs["gen"].extracted == {"strict": "[invalid]", "flex": "4"}
    assert recs["gen"].completion == "The answer is 4"
    assert recs["gen"].item_id == "5"
    assert not math.isnan(recs["mc"].scores["acc,none"])


@pytest.mark.parametrize(("value", "shown"), [(math.nan, "nan"), (math.inf, "inf")])
def test_non_finite_metric_is_an_errored_sample(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, value: float, shown: str
) -> None:
    """The review's repro in an lm-eval log: a per-doc metric NaN / Infinity (as json.dumps writes it)."""
    lines = mc_lines([1, 0, 1])
    lines[1]["acc_norm"] = value
    sub = write_run(tmp_path / "a", {"t": lines})
    path = sub / f"samples_t_{DATE}.jsonl"
    assert ("NaN" if shown == "nan" else "Infinity") in path.read_text().splitlines()[1]
    with caplog.at_level(logging.WARNING):
        recs = import_lmeval(tmp_path / "a")
    assert [r.error is None for r in recs] == [True, False, True]
    bad = recs[1]
    assert bad.scores == {} and bad.extracted == {}
    assert bad.error == f"non-finite score {shown} for 'acc_norm,none' (samples_t_{DATE}.jsonl:2)"
    assert bad.choice_loglikelihoods is not None  # the engine's answer is kept
    assert "recorded as an errored sample" in caplog.text
    assert recs[0].scores == {"acc,none": 1.0, "acc_norm,none": 1.0}
