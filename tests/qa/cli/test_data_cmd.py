"""`qa data list` and `qa data verify` end to end (the data layer itself: tests/evals/data/)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qa.cli import main
from tests.shared_data import SHARED_DATA

DATA_DIR = SHARED_DATA
needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@needs_data
def test_verify_passes_on_shared_data(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["data", "verify", "math500", "piqa", "--data-dir", str(DATA_DIR)], capsys)
    assert rc == 0 and "5 ok, 0 failed" in out  # 2 splits + 3 files


@needs_data
def test_verify_fails_on_a_changed_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "math500").mkdir()
    shutil.copy(DATA_DIR / "manifest.json", tmp_path / "manifest.json")
    lines = (DATA_DIR / "math500/test.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "math500/test.jsonl").write_text("".join(lines[:499]), encoding="utf-8")
    rc, out, _ = run(["data", "verify", "math500", "--data-dir", str(tmp_path)], capsys)
    assert rc == 1 and "0 ok, 2 failed" in out


def test_verify_needs_a_data_dir(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("QA_DATA_DIR", raising=False)
    rc, _, err = run(["data", "verify"], capsys)
    assert rc == 2 and err.startswith("error: verify needs a local data folder") and err.count("\n") == 1


def test_list_names_the_hub_sources(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("QA_DATA_DIR", raising=False)
    rc, out, _ = run(["data", "list"], capsys)
    assert rc == 0 and "openai/gsm8k" in out and "Idavidrein/gpqa" in out
