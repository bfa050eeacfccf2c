"""Data file hashes: the {file: sha256} that env.json records, and the check behind `qa data verify`
(every split loads with its registered count and shape; every file matches manifest.json)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from evals.data.files import require_file
from evals.data.registry import DATASETS, data_files, get_spec
from evals.errors import DataError
from quant.fileio import sha256_file

MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class DataCheck:
    """One result of `qa data verify`: a split's item count, or a file's sha256 against manifest.json."""

    dataset: str
    subject: str  # "split <name>" or a file path relative to the data dir
    ok: bool
    detail: str


def data_file_hashes(names: Iterable[str], data_dir: Path | None) -> dict[str, str]:
    """{relative path: sha256} of the local files behind the named datasets (env.json; a run's tasks name
    theirs through evals.tasks.task_datasets); {} for hub data."""
    if data_dir is None:
        return {}
    hashes: dict[str, str] = {}
    for rel in data_files(names):
        path = Path(data_dir) / rel
        require_file(path, "a dataset file listed in evals.data.DATASETS")
        hashes[rel] = sha256_file(path)
    return hashes


def manifest_hashes(data_dir: Path) -> dict[str, str]:
    """{relative path: sha256} from the data dir's manifest.json; {} when there is none."""
    path = Path(data_dir) / MANIFEST_FILE
    if not path.is_file():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        return {f["file"]: f["sha256"] for ds in manifest["datasets"] for f in ds.get("files", [])}
    except (json.JSONDecodeError, KeyError, TypeError):
        raise DataError(f"{path}: expected {{'datasets': [{{'files': [{{'file', 'sha256'}}]}}]}}") from None


def _file_check(name: str, rel: str, data_dir: Path, expected: dict[str, str]) -> DataCheck:
    """One file of dataset `name` against its manifest.json entry (when there is one)."""
    path = Path(data_dir) / rel
    if not path.is_file():
        return DataCheck(name, rel, False, "missing")
    if rel not in expected:
        return DataCheck(name, rel, True, "present (no manifest.json entry to compare)")
    digest = sha256_file(path)
    if digest == expected[rel]:
        return DataCheck(name, rel, True, "sha256 matches manifest.json")
    return DataCheck(name, rel, False,
                     f"sha256 {digest[:12]}... differs from manifest.json {expected[rel][:12]}...")


def verify(data_dir: Path, names: Iterable[str] | None = None) -> list[DataCheck]:
    """Load every split of the named datasets (default: all) and check counts and shapes, then
    compare each file's sha256 with manifest.json when the data dir has one."""
    names = list(DATASETS) if names is None else list(names)
    expected = manifest_hashes(data_dir)
    checks: list[DataCheck] = []
    for name in names:
        spec = get_spec(name)
        for split, part in spec.splits.items():
            try:
                n = len(part.read(Path(data_dir), part))
                checks.append(DataCheck(name, f"split {split}", True, f"{n} items"))
            except DataError as exc:
                checks.append(DataCheck(name, f"split {split}", False, str(exc)))
        checks.extend(_file_check(name, rel, data_dir, expected) for rel in data_files([name]))
    return checks
