"""Resume without work does no work: a rerun of a finished run starts no worker and loads no model (qa.pipeline.resume),
an arm missing one sample runs alone, and an arm.json of another configuration is never taken for complete."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from qa import api
from qa.files.spec import parse_spec
from qa.pipeline import processes
from qa.pipeline.resolve import resolve_run
from qa.pipeline.resume import arm_complete
from tests.evals.hf_fixtures import save_tiny
from tests.shared_data import shared_data_dir

SPEC = """
name = "resume"
model = "MODEL"
seed = 5
[arms.baseline]
engine_args = {{ batch_size = 4 }}
[arms.candidate]
engine_args = {{ batch_size = 4, kv = {{ format = "nvfp4" }} }}
[[tasks]]
name = "arc_easy"
limit = 6
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, api.RunResult]:
    root = tmp_path_factory.mktemp("resume")
    text = SPEC.replace("MODEL", str(save_tiny(root / "model"))).replace("{{", "{").replace("}}", "}")
    result = api.run(parse_spec(text), root / "run", data_dir=shared_data_dir("arc_easy"))
    return root / "run", text, result


def _records(run: Path) -> dict[str, bytes]:
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.glob("records/*/*"))}


def test_a_rerun_of_a_finished_run_starts_no_child(finished: tuple[Path, str, api.RunResult],
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run, text, first = finished
    before = _records(run)

    def no_child(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        raise AssertionError(f"a child started: {cmd}")

    monkeypatch.setattr(processes.subprocess, "run", no_child)
    again = api.run(parse_spec(text), run, data_dir=shared_data_dir("arc_easy"))
    assert again.verdict == first.verdict and _records(run) == before
    assert capsys.readouterr().out.count("every record is on disk; nothing to run") == 2


def test_only_the_arm_missing_a_sample_runs(finished: tuple[Path, str, api.RunResult],
                                            started_arms: list[str]) -> None:
    run, text, first = finished
    path = run / "records" / "candidate" / "arc_easy.jsonl"
    full = path.read_bytes()
    path.write_bytes(b"".join(full.splitlines(keepends=True)[:-1]))  # the last sample lost
    again = api.run(parse_spec(text), run, data_dir=shared_data_dir("arc_easy"))
    assert started_arms == ["candidate"] and path.read_bytes() == full and again.verdict == first.verdict


def test_another_configuration_is_never_complete(finished: tuple[Path, str, api.RunResult]) -> None:
    run, text, _ = finished
    resolved = resolve_run(parse_spec(text), run, data_dir=shared_data_dir("arc_easy"), spec_dir=None)
    assert all(arm_complete(resolved, a) for a in resolved.arms)
    other = resolve_run(parse_spec(text.replace("limit = 6", "limit = 5")), run, data_dir=shared_data_dir("arc_easy"),
                        spec_dir=None)
    assert not any(arm_complete(other, a) for a in other.arms)  # a task fingerprint changed (its limit)
    manifest = run / "records" / "baseline" / "arm.json"
    saved = manifest.read_text()
    doc = json.loads(saved)
    manifest.write_text(json.dumps({**doc, "fingerprint": "0" * 64}))
    try:
        assert not arm_complete(resolved, resolved.arm("baseline"))
    finally:
        manifest.write_text(saved)
