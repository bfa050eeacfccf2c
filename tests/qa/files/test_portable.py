"""No committed file names a path of the machine it was made on (qa.files.portable): reports, examples,
documents and the README are read elsewhere; scripts/portable_paths.py rewrites what a run left."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from qa.files.portable import machine_paths, portable_dir, portable_text

REPO = Path(__file__).resolve().parents[3]
COMMITTED = ("reports", "examples", "docs", "README.md")


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


def _committed_text_files() -> list[Path]:
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", *COMMITTED], capture_output=True, check=False)
    if listed.returncode != 0 or not listed.stdout:
        pytest.skip("not a git checkout: no list of committed files")
    return [REPO / name for name in listed.stdout.decode().split("\0") if name and (REPO / name).is_file()]


def test_no_committed_report_example_or_document_names_a_machine_path() -> None:
    left = []
    for path in _committed_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # plots
            continue
        left += [f"{path.relative_to(REPO)}: {p}" for p in machine_paths(text)]
    assert left == [], f"{len(left)} machine paths (scripts/portable_paths.py rewrites them): {left[:5]}"
