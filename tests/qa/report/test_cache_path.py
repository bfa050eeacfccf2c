"""The report's "Cache path" section (qa.report.cache_path) in report.md and report.html of a run directory
holding hand-made sessions records: hit rates, divergence per turn depth, flips, the A/A floor and the
gate's cache-path rules; absent for a run without a sessions task."""

from __future__ import annotations

from pathlib import Path

from pydantic import JsonValue

from evals.records.samples import write_records
from qa.compare.arms import compare_arms, load_arm
from qa.files.comparison import StatsSettings, save_comparison
from qa.files.policy import default_policy_text
from qa.files.resolved_json import ArmRecord, PolicyRecord, ResolvedRecord, text_sha256
from qa.files.rundir import RunDir
from qa.report import render
from qa.report.cache_path import ARM_HEADERS, TURN_HEADERS, replayed_arms
from tests.qa.cache_path_fixtures import sessions_arm

FLIPPED = frozenset({(s, 1) for s in range(6)})


def _run(tmp_path: Path, base, cand) -> Path:  # type: ignore[no-untyped-def]
    run = tmp_path / "run"
    for arm, recs in (("baseline", base), ("candidate", cand)):
        write_records(run / "records" / arm / "sessions.jsonl", recs)
    comp = compare_arms(load_arm(run / "records" / "baseline"), load_arm(run / "records" / "candidate"),
                        StatsSettings(bootstrap_n=0))
    save_comparison(run / "comparison.json", comp)
    return run


def test_cache_path_section_in_markdown_and_html(tmp_path: Path) -> None:
    cand = [r.model_copy(update={"completion": "<b>x</b>"}) if r.item_id == "s001/t1/warm" else r
            for r in sessions_arm("candidate", flipped=FLIPPED)]
    paths = render(_run(tmp_path, sessions_arm("baseline"), cand))
    md, page = paths.markdown.read_text(), paths.html.read_text()
    assert "## Cache path" in md and "<h2>Cache path</h2>" in page
    for header in (*ARM_HEADERS, *TURN_HEADERS):
        assert header.replace("|", "\\|") in md
    row = next(line for line in md.splitlines() if line.startswith("| candidate | 30.0% (360 of 1200 tokens)"))
    assert "| 0% |" in row and "6/12 (50.0%" in row  # cold hit rate 0; 6 of 12 warm completions identical
    assert "exact_match,none: 6/12 (3 worse warm, 3 better)" in row
    assert "A/A floor" in md and "12/12 (100.0%" in row  # shuffled pass bit-identical to cold
    section = md.split("## Cache path")[1].split("\n## ")[0]  # the per-slice section below has rows like these
    turn_rows = [line for line in section.splitlines() if line.startswith(("| 1 | ", "| 2 | "))]
    assert [r.split(" | ")[1] for r in turn_rows] == ["baseline", "candidate", "baseline", "candidate"]
    assert any(r.startswith("| 2 | candidate | 6 | 60.0% | 6/6 (100.0%") for r in turn_rows)
    assert "Excess flips (exact_match,none): 6 candidate vs 0 baseline" in md
    assert "Gate cache_flips (reported): fail" in md and "Gate cache_hit_rate (reported): pass" in md
    assert "Gate cache_accuracy (decides)" in md
    assert "candidate warm path vs baseline cold path" in md
    assert "&lt;b&gt;" not in page.split("<h2>Cache path</h2>")[1].split("<h2>")[0]  # completions not shown here
    assert "<script" not in page


def test_a_warm_path_without_hits_reads_no_information(tmp_path: Path) -> None:
    md = render(_run(tmp_path, sessions_arm("baseline"), sessions_arm("candidate", cached=None))).markdown.read_text()
    assert "| candidate | not reported |" in md
    assert "Gate cache_hit_rate (reported): inconclusive: no information" in md


def test_no_section_without_a_sessions_task(tmp_path: Path) -> None:
    plain = [r.model_copy(update={"meta": {}}) for r in sessions_arm("baseline") if r.meta["cache_path"] == "cold"]
    cand = [r.model_copy(update={"arm": "candidate"}) for r in plain]
    paths = render(_run(tmp_path, plain, cand))
    assert "Cache path" not in paths.markdown.read_text() and "Cache path" not in paths.html.read_text()


def _resolved(arms: dict[str, dict[str, JsonValue]]) -> ResolvedRecord:
    """A resolved.json record of hf arms with these engine arguments (the first one the baseline)."""
    return ResolvedRecord(
        name="x", model="gemma3-270m", seed=0, data_dir=None,
        policy=PolicyRecord(name="default", ref="default", path=None, sha256=text_sha256(default_policy_text())),
        sequential=False, tasks=[],
        arms=[ArmRecord(name=name, kind="baseline" if i == 0 else "candidate", engine="hf", model="gemma3-270m",
                        load="gemma3-270m", engine_args=args, runs=True, records=f"records/{name}")
              for i, (name, args) in enumerate(arms.items())])


def test_a_replaying_hf_arm_is_labelled_as_vllms_replay_on_a_model_vllm_does_not_replay(tmp_path: Path) -> None:
    """The label comes from the arms' engine arguments in resolved.json, not from spec.toml's text."""
    run = _run(tmp_path, sessions_arm("baseline"), sessions_arm("candidate"))
    (run / "spec.toml").write_text('name = "x"\nmodel = "gemma3-270m"\n')  # names no replay: not read for it
    RunDir(run).save_resolved(_resolved({
        "baseline": {"kv": {"format": "none", "prefix_cache": {"enabled": True}}},
        "candidate": {"kv": {"format": "nvfp4", "prefix_cache": {"enabled": True, "replay_window": 128}}}}),
        default_policy_text())
    paths = render(run)
    label = ("Arm candidate: replay window 128: vLLM's bounded replay (built for DeepSeek-V4.1's sliding-window "
             "layers) applied to a model vLLM does not replay")
    assert label in paths.markdown.read_text()
    assert "Arm baseline" not in paths.markdown.read_text()
    assert "vLLM&#x27;s bounded replay (built for DeepSeek-V4.1" in paths.html.read_text()


def test_replay_windows_read_from_resolved_json() -> None:
    """Only an hf arm whose enabled prefix cache replays counts; no resolved.json, no label."""
    record = _resolved({"baseline": {"kv": {"format": "nvfp4", "prefix_cache": {"enabled": True}}},
                        "off": {"kv": {"format": "nvfp4"}},
                        "plain": {},
                        "replay": {"kv": {"format": "nvfp4", "prefix_cache": {"replay_window": 64}}}})
    assert replayed_arms(record) == {"replay": 64}
    assert replayed_arms(None) == {}
