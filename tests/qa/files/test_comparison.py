"""qa.files.comparison.load_comparison: a schema-1 file is one line naming the script that migrates it, an
unknown schema names the one this toolkit reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qa.errors import QAError
from qa.files.comparison import load_comparison


def test_a_schema_1_file_names_the_migration_script(tmp_path: Path) -> None:
    (tmp_path / "comparison.json").write_text(json.dumps({"schema_version": 1, "estimates": []}), encoding="utf-8")
    with pytest.raises(QAError, match=r"schema 1 comparison\.json: run python -m scripts\.migrate_comparisons$"):
        load_comparison(tmp_path)


def test_an_unknown_schema_names_the_one_read(tmp_path: Path) -> None:
    (tmp_path / "comparison.json").write_text(json.dumps({"schema_version": 3}), encoding="utf-8")
    with pytest.raises(QAError, match=r"schema_version 3, this toolkit reads 2"):
        load_comparison(tmp_path)
