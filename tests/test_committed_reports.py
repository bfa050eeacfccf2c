"""Every committed run's spec is one the current code would still run: its spec.toml parses, resolves (with
the policy.toml the run recorded) and passes the dry run's checks of the engines' arguments (each hf arm's
static scales and its kv spec against the model's config, what a served arm would refuse), with no model
run and no vLLM child process. A run the code now refuses is re-run or withdrawn (reports/WITHDRAWN.md).
Every committed run also records the code version it ran at (env.json git_sha), a commit of this repository's
history; the one run made at a commit that was never pushed says so in reports/README.md."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from qa.files.spec import load_spec
from qa.pipeline.preflight import check_hf_args, check_served_requests
from qa.pipeline.resolve import resolve_run
from tests.shared_data import shared_data_dir

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
RUNS = sorted(p.parent for p in REPORTS.glob("**/spec.toml")
              if not {"runs", "withdrawn"} & set(p.relative_to(REPORTS).parts))
GIT_SHA = 40  # hex digits of a full commit id
# Runs whose recorded commit is not in this history (an earlier session's local commit, lost before it was
# pushed); reports/README.md names each one and what its code was.
UNPUSHED = {"cache/emulator_floor"}


def test_there_are_committed_runs_and_a_record_of_the_withdrawn_ones() -> None:
    assert len(RUNS) >= 10
    assert (REPORTS / "WITHDRAWN.md").is_file()


@pytest.mark.parametrize("run", RUNS, ids=[str(r.relative_to(REPORTS)) for r in RUNS])
def test_a_committed_runs_spec_passes_the_dry_run_checks(run: Path, tmp_path: Path) -> None:
    spec = load_spec(run / "spec.toml")
    if (run / "policy.toml").is_file():  # the bytes of the policy it resolved (a relative path is the spec's)
        spec = spec.model_copy(update={"policy": str((run / "policy.toml").resolve())})
    resolved = resolve_run(spec, tmp_path / "run", data_dir=shared_data_dir(), spec_dir=run)
    check_hf_args(resolved)  # raises the one-line EngineError the dry run prints (exit 2)
    check_served_requests(resolved)


@pytest.mark.parametrize("run", RUNS, ids=[str(r.relative_to(REPORTS)) for r in RUNS])
def test_a_committed_run_records_the_code_version_it_ran_at(run: Path) -> None:
    sha = json.loads((run / "env.json").read_text())["git_sha"]
    assert isinstance(sha, str) and len(sha.removesuffix("-dirty")) == GIT_SHA
    name = str(run.relative_to(REPORTS))
    if name in UNPUSHED:
        assert name in (REPORTS / "README.md").read_text(encoding="utf-8")
        return
    shallow = _git("rev-parse", "--is-shallow-repository")
    if shallow is None or shallow.stdout.strip() == "true":
        pytest.skip("no full git history here to look the commit up in")
    found = _git("cat-file", "-e", f"{sha.removesuffix('-dirty')}^{{commit}}")
    assert found is not None and found.returncode == 0, f"{name}: {sha} is not a commit of this repository"


def _git(*args: str) -> subprocess.CompletedProcess[str] | None:
    """A git command in the repository (None: no git, or not a checkout)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
