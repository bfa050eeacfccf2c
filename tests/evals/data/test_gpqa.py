"""GPQA's password-protected zip, decrypted in memory. Question text is never printed or asserted on."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals import data
from evals.data import gpqa
from evals.errors import DataError
from tests.shared_data import SHARED_DATA as DATA_DIR

needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data")


def _one_line(exc: pytest.ExceptionInfo[DataError]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


@needs_data
def test_ids_are_record_ids() -> None:
    rows = data.load("gpqa_diamond", DATA_DIR)
    assert all(r["id"] == r["Record ID"] and r["id"].startswith("rec") for r in rows)
    assert set(gpqa.GPQA_COLUMNS) <= set(rows[0])  # column names only: no question text


@needs_data
def test_wrong_password_is_one_line_and_reveals_nothing() -> None:
    with pytest.raises(DataError) as exc:
        gpqa.read_gpqa(DATA_DIR / "gpqa/dataset.zip", "diamond", password=b"not-the-password")
    msg = _one_line(exc)
    assert "dataset.zip:dataset/gpqa_diamond.csv" in msg and ("password" in msg or "decrypt" in msg)
    assert len(msg) < 300


def test_not_a_zip(tmp_path: Path) -> None:
    (tmp_path / "gpqa").mkdir()
    (tmp_path / "gpqa/dataset.zip").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataError) as exc:
        data.load("gpqa_diamond", tmp_path)
    assert "dataset.zip" in _one_line(exc)
