"""No committed file names a path of the machine it was made on (qa.files.portable): reports, examples,
documents, code and the README are read elsewhere. In reports/ and examples/ no JSON or TOML value is an
absolute path at all, and every "{run}/" path a committed resolved.json holds stays, resolved against the
folder it is committed in, in the repository or in the workspace's shared/ folder (the data).
`python -m scripts.portable_paths` rewrites what a run left, and re-bases a moved run folder's paths."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qa.files.portable import machine_paths, portable_dir, portable_text
from qa.files.resolved_json import RUN_MARK
from scripts.portable_paths import fix_resolved

REPO = Path(__file__).resolve().parents[3]
# Committed files that name machine paths on purpose: the tests' fixtures, and the module whose rule lists the
# roots it rewrites.
NAMES_PATHS_ON_PURPOSE = ("tests/", "qa/files/portable.py")
STRUCTURED = ("reports", "examples")  # no JSON / TOML value there is an absolute path
# An absolute path in an example that is not a machine of ours: the folder a user deploys, to be edited.
PLACEHOLDERS = {("examples/deepseek_v4_flash_emulated_kv.toml", "/models/DeepSeek-V4.1-Flash-NVFP4")}


def test_the_repository_home_and_temporary_folders_are_rewritten() -> None:
    text = (f"model='{Path.home()}/.cache/m' log={REPO}/reports/runs/x/a.log data={REPO.parent}/shared/data "
            f"run directory: /tmp/cache_b")
    assert portable_text(text, REPO) == ("model='~/.cache/m' log=reports/runs/x/a.log data=shared/data "
                                         "run directory: cache_b")


def test_machine_paths_finds_roots_of_one_machine_and_leaves_the_rest() -> None:
    text = "/work/runs/out_a and /root/.cache/x, /home/ann/m and /tmp/t1 but not https://a.b/work/x or ~/x or a/tmp/b"
    assert machine_paths(text) == ["/work/runs/out_a", "/root/.cache/x", "/home/ann/m", "/tmp/t1"]


def test_a_run_folder_is_named_relative_to_the_working_directory_or_by_its_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "reports" / "runs" / "r1").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert portable_dir(tmp_path / "reports" / "runs" / "r1") == "reports/runs/r1"
    assert portable_dir(Path("/elsewhere/out/r2")) == "r2"


def _committed(*paths: str) -> list[Path]:
    """The committed files (git ls-files) under `paths` (all of them when none is given)."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", *paths], capture_output=True, check=False)
    if listed.returncode != 0 or not listed.stdout:
        pytest.skip("not a git checkout: no list of committed files")
    return [REPO / name for name in listed.stdout.decode().split("\0") if name and (REPO / name).is_file()]


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # plots, safetensors
        return None


def test_no_committed_file_names_a_machine_path() -> None:
    files = [p for p in _committed() if not str(p.relative_to(REPO)).startswith(NAMES_PATHS_ON_PURPOSE)]
    assert any(p.parts[len(REPO.parts)] == "reports" for p in files)  # the reports are read, not skipped
    left = [f"{path.relative_to(REPO)}: {p}" for path in files if (text := _text(path)) is not None
            for p in machine_paths(text)]
    assert left == [], f"{len(left)} machine paths (python -m scripts.portable_paths rewrites them): {left[:5]}"


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


def _values(path: Path) -> list[str]:
    """Every string value of a JSON, JSON Lines or TOML file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return list(_strings(json.loads(text)))
    if path.suffix == ".jsonl":
        return [s for line in text.splitlines() if line.strip() for s in _strings(json.loads(line))]
    return list(_strings(tomllib.loads(text)))


def is_absolute(value: str) -> bool:
    """A POSIX or Windows absolute path, or one under the home folder."""
    return (value.startswith("/") and len(value) > 1 and not value[1].isspace()) or value.startswith("~/") or (
        len(value) > 2 and value[0].isalpha() and value[1] == ":" and value[2] in "/\\")


def test_is_absolute() -> None:
    assert all(map(is_absolute, ["/models/m", "~/x", "C:\\data", "/tmp"]))
    assert not any(map(is_absolute, ["{run}/../shared/data", "records/baseline", "/", "a/b", "/ x", "nvfp4"]))


def test_no_json_or_toml_value_in_reports_or_examples_is_an_absolute_path() -> None:
    files = [p for p in _committed(*STRUCTURED) if p.suffix in (".json", ".jsonl", ".toml")]
    assert len(files) > 100  # every run folder's env, comparison, verdict, resolved.json and spec
    found = {(str(p.relative_to(REPO)), v) for p in files for v in _values(p) if is_absolute(v)}
    assert found - PLACEHOLDERS == set()


def _lands_in(run_dir: Path, value: str) -> str:
    """Where a "{run}/" path lands, relative to the workspace (the repository's parent), resolved lexically."""
    here = posixpath.relpath(os.path.abspath(run_dir), os.path.dirname(os.path.abspath(REPO)))
    return posixpath.normpath(posixpath.join(here, value[len(RUN_MARK):]))


def test_a_committed_resolved_json_names_files_in_the_repository_or_the_shared_folder() -> None:
    folders = [p.parent for p in _committed("reports") if p.name == "resolved.json"]
    assert len(folders) >= 5
    landed = {(str(f.relative_to(REPO)), v, _lands_in(f, v)) for f in folders
              for v in _strings(json.loads((f / "resolved.json").read_text())) if v.startswith(RUN_MARK)}
    assert landed, "no {run}/ path was found at all"
    outside = [x for x in landed if x[2].split("/")[0] not in (REPO.name, "shared")]
    assert outside == [], f"re-base them: python -m scripts.portable_paths ({outside[:3]})"


def test_a_moved_run_folders_paths_are_rebased_on_where_it_is_committed(tmp_path: Path) -> None:
    repo = tmp_path / "ws" / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "python").write_text("")
    (repo / "examples" / "policies").mkdir(parents=True)
    (repo / "examples" / "policies" / "p.toml").write_text("name = 'p'\n")
    run = repo / "reports" / "group" / "name"
    run.mkdir(parents=True)
    sha = hashlib.sha256(b"name = 'p'\n").hexdigest()
    data = {"data_dir": "{run}/../../../../../../../ws/shared/data",  # climbed to / from where it ran
            "policy": {"path": "{run}/../../../../elsewhere/policies/p.toml", "sha256": sha},
            "arms": [{"python": "{run}/../../../../.venv/bin/python"}, {"python": "{run}/../../../.venv/bin/python"},
                     {"python": "{run}/../../../../../opt/py"}]}
    (run / "resolved.json").write_text(json.dumps(data, indent=2) + "\n")
    changed, left = fix_resolved(run / "resolved.json", check=False, repo=repo)
    new = json.loads((run / "resolved.json").read_text())
    assert changed and left == ["{run}/../../../../../opt/py"]  # nothing of the repository's: left, and listed
    assert new["data_dir"] == "{run}/../../../../shared/data"
    assert new["policy"]["path"] == "{run}/../../../examples/policies/p.toml"  # the file with the recorded bytes
    assert [a["python"] for a in new["arms"]] == ["{run}/../../../.venv/bin/python"] * 2 + ["{run}/../../../../../opt/py"]
    assert fix_resolved(run / "resolved.json", check=True, repo=repo) == (False, ["{run}/../../../../../opt/py"])
