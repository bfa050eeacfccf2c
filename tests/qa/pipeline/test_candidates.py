"""Several candidates in one run, and a reused baseline, end to end on the hf engine (the tiny random
Llama of tests/tiny_models.py saved as a model folder, tiny limits).

One three-candidate run (plain, NVFP4 KV, FP8 KV: every candidate against the same baseline records)
is made once per module; the other tests build on it: a later single-candidate run that takes its
baseline from it (no baseline engine starts: the records are byte-equal copies), refusals naming the
first mismatch, and resumes after a cut (killed copy, lost candidate records).
"""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from evals.errors import RecordError
from evals.records.arm_file import ArmManifest
from evals.records.samples import read_records
from qa import api
from qa.files.rundir import RunDir
from qa.files.spec import parse_spec
from qa.files.verdict import RunVerdict, Verdict, load_verdict
from qa.gate.summary import STATUS_MARK
from quant.kv.inspect_report import load_inspect
from tests.shared_data import shared_data_dir

TASKS = """
[[tasks]]
name = "arc_easy"
limit = 6
[[tasks]]
name = "mmlu"
limit = 4
"""
THREE = """
name = "three"
model = "MODEL"
seed = 11
[arms.baseline]
engine_args = { batch_size = 4 }
[arms.plain]
engine_args = { batch_size = 4 }
[arms.nvfp4_kv]
engine_args = { batch_size = 4, kv = { format = "nvfp4" } }
[arms.fp8_kv]
engine_args = { batch_size = 4, kv = { format = "fp8_e4m3" } }
""" + TASKS
CANDIDATES = ["plain", "nvfp4_kv", "fp8_kv"]


def _reusing(source: Path, tasks: str = TASKS, model: Path | None = None) -> str:
    return f"""
name = "reuse"
model = "{model or source.parent / 'tiny'}"
seed = 11
[arms.baseline]
from = "{source}"
engine_args = {{ batch_size = 4 }}
[arms.candidate]
engine_args = {{ batch_size = 4, kv = {{ format = "fp8_e4m3" }} }}
""" + tasks


def _data() -> Path:
    return shared_data_dir("wikitext2")


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, api.RunResult]:
    """The three-candidate run; the tiny model folder is its sibling `tiny`."""
    from tests.evals.hf_fixtures import save_tiny

    folder = tmp_path_factory.mktemp("three")
    model = save_tiny(folder / "tiny")
    run = folder / "run"
    return run, api.run(parse_spec(THREE.replace("MODEL", str(model))), run, data_dir=_data())


def test_three_candidates_give_three_paired_verdicts_and_a_matrix(three: tuple[Path, api.RunResult]) -> None:
    run, result = three
    rd = RunDir(run)
    assert isinstance(result.verdict, RunVerdict)
    assert [c.name for c in result.verdict.candidates] == CANDIDATES
    assert rd.load_run_verdict() == result.verdict
    base = {p.name: p.read_bytes() for p in rd.arm_records("baseline").glob("*.jsonl")}
    for name in CANDIDATES:
        crd = rd.candidate(name)
        comparison = crd.load_comparison()
        assert (comparison.baseline, comparison.candidate) == ("baseline", name)
        verdict = load_verdict(crd.verdict)
        assert verdict.candidate == name and [t.task for t in verdict.tasks] == ["arc_easy", "mmlu"]
        assert result.verdict.candidates[CANDIDATES.index(name)].tasks == {t.task: t.status for t in verdict.tasks}
        arc = next(e for e in comparison.estimates if e.task == "arc_easy")
        assert arc.n == 6  # paired on the same six items
        assert crd.report_html.is_file() and crd.report_md.is_file()
    # the plain candidate is the baseline's configuration again: the same scores on every item
    plain = next(e for e in rd.candidate("plain").load_comparison().estimates if e.task == "arc_easy")
    assert plain.delta == 0.0
    # kv_inspect.json for the two emulated-cache candidates only, each in its own folder
    assert [n for n in CANDIDATES if rd.candidate(n).kv_inspect.is_file()] == ["nvfp4_kv", "fp8_kv"]
    assert not rd.kv_inspect.exists() and not rd.comparison.exists()
    # the run passes only when every candidate passes; it says which did
    statuses = [c.status for c in result.verdict.candidates]
    want = "fail" if "fail" in statuses else "pass" if set(statuses) == {"pass"} else "inconclusive"
    assert result.verdict.status == want and result.verdict.exit_code == {"pass": 0, "fail": 1, "inconclusive": 3}[want]
    assert result.verdict.passed == [c.name for c in result.verdict.candidates if c.status == "pass"]
    md, page = rd.report_md.read_text(), rd.report_html.read_text()
    for name in CANDIDATES:
        assert f"candidates/{name}/report.html" in page and f"(candidates/{name}/report.md)" in md
    assert "| candidate | verdict | KV bytes/token | arc_easy | mmlu |" in md
    for name in ("nvfp4_kv", "fp8_kv"):  # the emulated caches' memory, from their kv_inspect.json
        sizes = load_inspect(rd.candidate(name).kv_inspect).bytes_per_token()
        assert sizes is not None and f"| {sizes[0]} ({100 * sizes[0] / sizes[1]:.0f}%) |" in md
    assert f"[plain](candidates/plain/report.md) | {STATUS_MARK[statuses[0]]} | \\- |" in md
    assert "<script" not in page
    suites = ET.fromstring(rd.junit.read_text().split("\n", 1)[1]).findall("testsuite")
    assert [s.get("name") for s in suites] == [f"qa gate: {n} vs baseline" for n in CANDIDATES]
    assert all(len(s.findall("testcase")) == 2 for s in suites)
    assert rd.step_summary.read_text().count("### ") == 3
    assert {p.name: p.read_bytes() for p in rd.arm_records("baseline").glob("*.jsonl")} == base


def test_gate_and_report_commands_redo_a_several_candidate_run(three: tuple[Path, api.RunResult]) -> None:
    run, result = three
    from qa.cli import main

    with pytest.raises(SystemExit) as info:
        main(["gate", str(run)])
    assert info.value.code == result.verdict.exit_code
    assert RunDir(run).load_run_verdict().candidates == result.verdict.candidates
    with pytest.raises(SystemExit) as info:
        main(["report", str(run)])
    assert not info.value.code
    with pytest.raises(SystemExit) as info:
        main(["report", str(run), "--out", str(run / "elsewhere")])
    assert info.value.code == 2


def test_a_matching_baseline_is_copied_not_run(three: tuple[Path, api.RunResult], tmp_path: Path,
                                               started_arms: list[str]) -> None:
    source, _ = three
    run = tmp_path / "reuse"
    result = api.run(parse_spec(_reusing(source)), run, data_dir=_data())
    assert started_arms == ["candidate"]  # no baseline engine started
    assert isinstance(result.verdict, Verdict)  # one candidate named "candidate": the root layout
    rd, src = RunDir(run), RunDir(source)
    assert rd.comparison.is_file() and rd.verdict.is_file() and not (run / "candidates").exists()
    for task in ("arc_easy", "mmlu"):
        assert (rd.arm_records("baseline") / f"{task}.jsonl").read_bytes() == \
            (src.arm_records("baseline") / f"{task}.jsonl").read_bytes()
    manifest = ArmManifest.load(rd.arm_records("baseline") / "arm.json")
    old = ArmManifest.load(src.arm_records("baseline") / "arm.json")
    assert manifest.reused_from is not None and manifest.reused_from.run_dir == str(source.resolve())
    assert manifest.reused_from.fingerprint == old.fingerprint == manifest.fingerprint
    # the candidate is the source's fp8_kv configuration: the same records under another arm name
    same = [(r.item_id, r.scores) for r in read_records(rd.arm_records("candidate") / "arc_easy.jsonl")]
    assert same == [(r.item_id, r.scores) for r in read_records(src.arm_records("fp8_kv") / "arc_easy.jsonl")]
    # resume after a kill during the copy (records without arm.json) and in the candidate (half its
    # records, no comparison yet): same bytes, same verdict, and still no baseline engine
    before = {arm: {p.name: p.read_bytes() for p in rd.arm_records(arm).iterdir()} for arm in ("baseline", "candidate")}
    (rd.arm_records("baseline") / "arm.json").unlink()
    (rd.arm_records("baseline") / "arc_easy.jsonl").write_bytes(b"")
    half = rd.arm_records("candidate") / "arc_easy.jsonl"
    half.write_bytes(b"".join(half.read_bytes().splitlines(keepends=True)[:3]))
    rd.comparison.unlink()
    again = api.run(parse_spec(_reusing(source)), run, data_dir=_data())
    assert {arm: {p.name: p.read_bytes() for p in rd.arm_records(arm).iterdir()} for arm in before} == before
    assert again.verdict == result.verdict and started_arms == ["candidate", "candidate"]


@pytest.mark.parametrize(("change", "message"), [
    (("limit = 4", "limit = 4\nnum_fewshot = 1"), r"mmlu\.jsonl: item '.*' was run with a different prompt"),
    (("limit = 6", "limit = 5"), "task 'arc_easy' limit: earlier run 6, this run 5"),
    (("limit = 6", "limit = 6\nrepeats = 2"), "task 'arc_easy' repeats: earlier run 1, this run 2"),
])
def test_a_baseline_that_differs_is_refused_naming_the_first_mismatch(
        three: tuple[Path, api.RunResult], tmp_path: Path, change: tuple[str, str], message: str) -> None:
    source, _ = three
    spec = parse_spec(_reusing(source, TASKS.replace(*change)))
    with pytest.raises(RecordError, match=message) as info:
        api.run(spec, tmp_path / "refused", data_dir=_data())
    assert "\n" not in str(info.value) and "cannot reuse" in str(info.value)
    assert not (tmp_path / "refused").exists()  # refused before anything is written


def test_other_engine_arguments_or_seed_are_refused(three: tuple[Path, api.RunResult], tmp_path: Path) -> None:
    source, _ = three
    text = _reusing(source).replace("engine_args = { batch_size = 4 }", "engine_args = { batch_size = 2 }", 1)
    with pytest.raises(RecordError, match=r"engine_args: earlier run \{'batch_size': 4\}, this run \{'batch_size': 2\}"):
        api.run(parse_spec(text), tmp_path / "a", data_dir=_data())
    with pytest.raises(RecordError, match="seed: earlier run 11, this run 12"):
        api.run(parse_spec(_reusing(source).replace("seed = 11", "seed = 12")), tmp_path / "b", data_dir=_data())
    with pytest.raises(RecordError, match="no .*arm.json"):
        api.run(parse_spec(_reusing(tmp_path / "nowhere", model=source.parent / "tiny")), tmp_path / "c",
                data_dir=_data())


def test_a_several_candidate_run_resumes_where_it_was_cut(three: tuple[Path, api.RunResult], tmp_path: Path) -> None:
    """The fixture's run folder as a kill leaves it (one candidate half written, one not started, no
    comparison yet); the same spec then finishes with the uninterrupted run's records and verdicts.
    (A real SIGKILL at seeded moments is tests/test_crash_safety.py's job, on the one-candidate layout.)"""
    source, first = three
    run = tmp_path / "run"
    shutil.copytree(source, run)
    shutil.rmtree(run / "candidates")
    half = RunDir(run).arm_records("nvfp4_kv") / "arc_easy.jsonl"
    half.write_bytes(b"".join(half.read_bytes().splitlines(keepends=True)[:2]))
    shutil.rmtree(RunDir(run).arm_records("fp8_kv"))
    model = source.parent / "tiny"
    again = api.run(parse_spec(THREE.replace("MODEL", str(model))), run, data_dir=_data())
    for arm in ["baseline", *CANDIDATES]:
        for task in ("arc_easy", "mmlu"):
            got = (RunDir(run).arm_records(arm) / f"{task}.jsonl").read_bytes()
            assert got == (RunDir(source).arm_records(arm) / f"{task}.jsonl").read_bytes(), (arm, task)
    assert isinstance(again.verdict, RunVerdict)
    assert again.verdict.candidates == first.verdict.candidates and again.verdict.passed == first.verdict.passed
