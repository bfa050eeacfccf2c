"""The README's main job states the verdict its committed reference run records: the spec the README's command
runs, the run folder it links (reports/main_job/), and the verdict line (overall status, exit code, each task's
status) agree with that folder's spec.toml and verdict.json. A change that makes the README and the recorded
run disagree fails here until one of them is redone."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from qa.files.verdict import EXIT_CODES

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RUN = ROOT / "reports" / "main_job"
COMMAND = re.compile(r"qa run (examples/\S+\.toml)")
VERDICT = re.compile(r"\*\*(PASS|FAIL|INCONCLUSIVE)\*\*, exit (\d): ((?:\w+ (?:PASS|FAIL|INCONCLUSIVE)(?:, )?)+)")


def _main_job_section() -> str:
    """The README's text between "## Two commands" and the next section."""
    text = README.read_text(encoding="utf-8")
    start = text.index("## Two commands")
    return text[start:text.index("\n## ", start + 1)]


def test_the_readme_runs_the_spec_of_its_recorded_main_job() -> None:
    section = _main_job_section()
    (spec_path,) = {m.group(1) for m in COMMAND.finditer(section)}
    written = tomllib.loads((ROOT / spec_path).read_text(encoding="utf-8"))
    recorded = tomllib.loads((RUN / "spec.toml").read_text(encoding="utf-8"))
    assert recorded["name"] == written["name"] and recorded["model"] == written["model"]
    assert [t["name"] for t in recorded["tasks"]] == [t["name"] for t in written["tasks"]]
    assert [t.get("limit") for t in recorded["tasks"]] == [t.get("limit") for t in written["tasks"]]
    assert "reports/main_job/" in section


def test_the_readme_states_the_verdict_the_recorded_main_job_gives() -> None:
    match = VERDICT.search(_main_job_section())
    assert match is not None, "the README's main-job section has no '**STATUS**, exit N: task STATUS, ...' line"
    verdict = json.loads((RUN / "verdict.json").read_text(encoding="utf-8"))
    status, code, tasks = match.group(1).lower(), int(match.group(2)), match.group(3)
    assert status == verdict["status"] and code == EXIT_CODES[verdict["status"]]
    stated = dict(pair.split(" ") for pair in tasks.split(", "))
    assert {t: s.lower() for t, s in stated.items()} == {t["task"]: t["status"] for t in verdict["tasks"]}
