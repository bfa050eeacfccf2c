"""Datasets by name: read from a local folder laid out like `shared/data`, else from the hub.

Layout: `spec` (what a dataset is), `registry` (the DATASETS dict, lookups by name), `files` (the
data folder and the checked JSONL/CSV readers), `readers` (one local reader per dataset), `gpqa`
(the password-protected zip, decrypted in memory only), `hub` (the hub fallback), `integrity` (file
hashes for env.json and the manifest check); `hub_offline` is evals.offline's. Missing, truncated or
wrong-shaped files raise `DataError` with one line naming the file and what was expected.
"""

from __future__ import annotations

from pathlib import Path

from evals.data.files import DATA_DIR_ENV, resolve_data_dir
from evals.data.gpqa import read_gpqa
from evals.data.hub import load_hub
from evals.data.integrity import DataCheck, data_file_hashes, verify
from evals.data.registry import DATA_NOTES, DATASETS, MMLU_SUBJECTS, data_files, get_spec
from evals.data.spec import DatasetSpec, Row
from evals.errors import DataError
from evals.offline import hub_offline

__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "DATA_NOTES",
    "MMLU_SUBJECTS",
    "DataCheck",
    "DatasetSpec",
    "Row",
    "data_file_hashes",
    "data_files",
    "get_spec",
    "hub_offline",
    "load",
    "read_gpqa",
    "resolve_data_dir",
    "verify",
]


def load(name: str, data_dir: Path | None, split: str | None = None) -> list[Row]:
    """Rows of one split (default: the evaluation split) from `data_dir`, or the hub if None."""
    spec = get_spec(name)
    split = split or spec.eval_split
    if split not in spec.splits:
        raise DataError(f"dataset {name!r} has no split {split!r}; splits: {', '.join(spec.splits)}")
    if data_dir is None:
        return load_hub(spec, split)
    part = spec.splits[split]
    return part.read(Path(data_dir), part)
