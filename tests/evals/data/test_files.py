"""The data folder (`--data-dir` / $QA_DATA_DIR) and the checked JSONL reader every dataset uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals import data
from evals.data import files
from evals.errors import DataError
from tests.shared_data import SHARED_DATA as DATA_DIR

needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data")


def _one_line(exc: pytest.ExceptionInfo[DataError]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_resolve_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(files.DATA_DIR_ENV, raising=False)
    assert files.resolve_data_dir(None) is None
    assert files.resolve_data_dir(str(tmp_path)) == tmp_path
    monkeypatch.setenv(files.DATA_DIR_ENV, str(tmp_path))
    assert files.resolve_data_dir(None) == tmp_path
    assert files.resolve_data_dir("") == tmp_path  # an empty option falls back to the variable
    with pytest.raises(DataError, match=r"not a folder \(--data-dir\)"):
        files.resolve_data_dir(tmp_path / "nope")
    monkeypatch.setenv(files.DATA_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(DataError, match=r"not a folder \(\$QA_DATA_DIR\)"):
        files.resolve_data_dir(None)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        data.load("math500", tmp_path)
    msg = _one_line(exc)
    assert str(tmp_path / "math500" / "test.jsonl") in msg and "missing" in msg


@needs_data
def test_truncated_jsonl(tmp_path: Path) -> None:
    (tmp_path / "math500").mkdir()
    lines = (DATA_DIR / "math500/test.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "math500/test.jsonl").write_text("".join(lines[:100]), encoding="utf-8")
    with pytest.raises(DataError) as exc:
        data.load("math500", tmp_path)
    assert "100 items, expected 500" in _one_line(exc)
    (tmp_path / "math500/test.jsonl").write_text("".join(lines[:100]) + lines[100][:40], encoding="utf-8")
    with pytest.raises(DataError) as exc:
        data.load("math500", tmp_path)
    assert "test.jsonl:101: not valid JSON" in _one_line(exc)


def test_wrong_shape_jsonl(tmp_path: Path) -> None:
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k/test.jsonl").write_text('{"question": "q", "solution": "s"}\n', encoding="utf-8")
    with pytest.raises(DataError) as exc:
        data.load("gsm8k", tmp_path)
    assert "test.jsonl:1: expected a JSON object with keys question, answer" in _one_line(exc)


def test_csv_with_a_short_row(tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        files.read_csv_text("a,b\n1,2\n3\n", tmp_path / "x.csv", ("a", "b"))
    assert "x.csv: row 3 has the wrong number of fields" in _one_line(exc)
