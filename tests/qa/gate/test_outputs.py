"""The gate's outputs: verdict.json, JUnit XML, the CI step summary, and `qa gate` exit codes."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from qa import api
from qa.files.policy import default_policy
from qa.files.verdict import load_verdict
from qa.gate.junit import junit_xml
from qa.gate.rules import apply_rules
from qa.gate.summary import summary_markdown, write_summary
from tests.qa.gate_fixtures import comparison, estimate_from_scores, make_run_dir, scores

DEFAULT = default_policy()


def _one(task: str, n: int, both: int, n10: int, n01: int, **kw: object):
    a, b = scores(n, both, n10, n01)
    return estimate_from_scores(task, a, b, **kw)



def test_gate_run_writes_verdict(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", kv=False)
    v = api.gate(run, DEFAULT)
    assert v.status == "fail"
    loaded = load_verdict(run / "verdict.json")
    assert loaded == v
    assert loaded.comparison_sha256 is not None and len(loaded.comparison_sha256) == 64
    data = json.loads((run / "verdict.json").read_text())
    assert [t["status"] for t in data["tasks"]] == ["pass", "fail", "inconclusive", "inconclusive"]
    assert all(isinstance(t["reason"], str) and "\n" not in t["reason"] for t in data["tasks"])


def test_junit_one_testcase_per_task() -> None:
    hostile = _one("<task>&\x01", 1000, 600, 20, 18)
    v = apply_rules(comparison(hostile, _one("b", 1000, 600, 60, 15), _one("c", 198, 60, 14, 9)), DEFAULT)
    root = ET.fromstring(junit_xml(v).split("\n", 1)[1])
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == 3
    assert cases[0].get("name", "").startswith("<task>&")
    assert cases[0].find("failure") is None and cases[0].find("error") is None
    assert cases[1].find("failure") is not None
    err = cases[2].find("error")
    assert err is not None and err.get("type") == "inconclusive:underpowered"
    assert root.get("failures") == "1" and root.get("errors") == "1"


def test_summary_markdown_escapes_and_appends(tmp_path: Path) -> None:
    v = apply_rules(comparison(_one("<script>x</script>|t", 1000, 600, 20, 18)), DEFAULT)
    md = summary_markdown(v)
    assert md.startswith("## ✅ PASS")
    assert "<script>" not in md and "&lt;script&gt;" in md
    assert "\\|t" in md  # a pipe cannot break the table
    path = tmp_path / "summary.md"
    path.write_text("previous step\n")
    write_summary(path, v)
    text = path.read_text()
    assert text.startswith("previous step\n") and "✅ PASS" in text


def _cli(args: list[str]) -> int:
    from qa.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run_dir(tmp_path / "run", kv=False)
    junit, summary = tmp_path / "j.xml", tmp_path / "s.md"
    assert _cli(["gate", str(run), "--junit", str(junit), "--summary", str(summary)]) == 1
    assert junit.is_file() and summary.is_file()
    lenient = tmp_path / "lenient.toml"
    lenient.write_text('[default]\nmargin = 0.08\n[tasks.gsm8k]\nrules = ["noninferiority"]\n')
    # margin 8 pts: mmlu and gpqa pass, gsm8k (floor) stays inconclusive
    assert _cli(["gate", str(run), "--policy", str(lenient)]) == 3
    v = load_verdict(run / "verdict.json")
    assert [t.status for t in v.tasks] == ["pass", "pass", "pass", "inconclusive"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[default]\nmarign = 1\n")
    capsys.readouterr()
    assert _cli(["gate", str(run), "--policy", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "did you mean 'margin'" in err and err.count("\n") == 1
    assert _cli(["gate", str(tmp_path / "missing")]) == 2


def test_cli_pass_exit_zero(tmp_path: Path) -> None:
    from qa.files.comparison import save_comparison

    (tmp_path / "run").mkdir()
    save_comparison(tmp_path / "run" / "comparison.json", comparison(_one("arc", 1000, 600, 20, 18)))
    assert _cli(["gate", str(tmp_path / "run")]) == 0


def test_run_verdict_junit_and_summary_of_several_candidates(tmp_path: Path) -> None:
    from qa.files.verdict import load_run_verdict, save_run_verdict
    from qa.gate.candidates import run_verdict
    from qa.gate.junit import run_junit_xml
    from qa.gate.summary import run_summary_markdown

    good = apply_rules(comparison(_one("arc", 1000, 600, 20, 18)), DEFAULT)
    bad = apply_rules(comparison(_one("arc", 1000, 600, 60, 15), _one("<b>|x", 198, 60, 14, 9)), DEFAULT)
    bad = bad.model_copy(update={"candidate": "nvfp4_kv"})
    verdicts = {"replay": good.model_copy(update={"candidate": "replay"}), "nvfp4_kv": bad}
    run = run_verdict(verdicts, {n: f"candidates/{n}" for n in verdicts})
    assert (run.status, run.exit_code, run.passed) == ("fail", 1, ["replay"])
    assert run.summary.startswith("FAIL: 1 of 2 candidates passed") and run.summary.endswith("passed: replay")
    assert run.candidates[1].tasks == {"arc": "fail", "<b>|x": "inconclusive"}
    only_pass = run_verdict({"replay": verdicts["replay"]}, {"replay": "candidates/replay"})
    assert (only_pass.status, only_pass.exit_code) == ("pass", 0)
    save_run_verdict(tmp_path / "verdict.json", run)
    assert load_run_verdict(tmp_path / "verdict.json") == run
    root = ET.fromstring(run_junit_xml(list(verdicts.values())).split("\n", 1)[1])
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["qa gate: replay vs baseline", "qa gate: nvfp4_kv vs baseline"]
    assert [len(s.findall("testcase")) for s in suites] == [1, 2]
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("3", "1", "1")
    md = run_summary_markdown(run, list(verdicts.values()))
    assert md.startswith("## ❌ FAIL: 2 candidates vs baseline")
    assert "| candidate | verdict | arc | &lt;b&gt;\\|x |" in md  # escaped task names, one column per task
    assert "| replay | ✅ PASS | ✅ PASS | - |" in md
    assert md.count("\n### ") == 2  # each candidate's own summary follows
