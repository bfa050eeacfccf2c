"""The local data folder (`--data-dir` / $QA_DATA_DIR) and the checked JSON-lines and CSV readers
every dataset reader builds on: a missing, truncated or wrong-shaped file is one DataError line
naming the file (and line) and what was expected."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable
from pathlib import Path

from evals.data.spec import Row, Split
from evals.errors import DataError
from quant.fileio import jsonl_objects

DATA_DIR_ENV = "QA_DATA_DIR"


def resolve_data_dir(arg: str | Path | None) -> Path | None:
    """The data folder: `arg`, else $QA_DATA_DIR, else None (load from the hub)."""
    value = arg if arg not in (None, "") else os.environ.get(DATA_DIR_ENV) or None
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        source = "--data-dir" if arg not in (None, "") else f"${DATA_DIR_ENV}"
        raise DataError(f"{path}: not a folder ({source}); expected a data folder laid out like shared/data")
    return path


def require_file(path: Path, what: str) -> None:
    """DataError naming `path` and `what` it should hold unless it is a file."""
    if not path.is_file():
        raise DataError(
            f"{path}: missing; expected {what} (point --data-dir or {DATA_DIR_ENV} at a data folder)"
        )


def read_jsonl(path: Path, keys: tuple[str, ...]) -> list[Row]:
    """The JSON objects of a JSON-lines file, each required to have `keys` (blank lines skipped)."""
    require_file(path, f"a JSON-lines file with keys {', '.join(keys)}")
    with open(path, encoding="utf-8") as fh:
        return [obj for _, obj in jsonl_objects(fh, path, DataError, corrupt="the file is truncated or corrupt",
                                                 expected=f"expected a JSON object with keys {', '.join(keys)}",
                                                 keys=keys)]


def read_csv_text(text: str, path: Path | str, columns: tuple[str, ...]) -> list[dict[str, str]]:
    """The rows of CSV `text` (read from `path`, named in errors), each required to have `columns`."""
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataError(f"{path}: expected CSV columns {', '.join(columns)}; missing {', '.join(missing)}")
    rows = list(reader)
    for lineno, row in enumerate(rows, start=2):
        if None in row or any(row[c] is None for c in columns):
            raise DataError(f"{path}: row {lineno} has the wrong number of fields (truncated or corrupt CSV)")
    return rows


def check_count(rows: list[Row], split: Split, where: Path | str) -> list[Row]:
    """`rows` when there are as many as the split's registered count; else DataError naming `where`."""
    if len(rows) != split.count:
        raise DataError(f"{where}: {len(rows)} items, expected {split.count} (truncated or wrong file)")
    return rows


def index_ids(rows: Iterable[Row]) -> list[Row]:
    """Rows with id = their index (a hub row's own "id", e.g. ARC's, is replaced: local copies lack it)."""
    return [{**row, "id": str(i)} for i, row in enumerate(rows)]
