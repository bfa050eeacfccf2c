"""What a dataset is: its splits (local files, item count, reader) and where its hub copy lives."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Row = dict[str, Any]
Reader = Callable[[Path, "Split"], list[Row]]  # (data dir, split) -> rows in hub field layout


@dataclass(frozen=True)
class HubSource:
    """Where the hub copy lives: `datasets.load_dataset(path, name, split=...)`."""

    path: str
    name: str | None
    splits: Mapping[str, str]  # our split -> hub split
    id_field: str | None = None  # None: the row index (MMLU: subject/index)


@dataclass(frozen=True)
class Split:
    """One split of a local dataset: the files it is read from and its item count."""

    files: tuple[str, ...]  # relative to the data dir; hashed into env.json
    count: int
    read: Reader


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset: its splits (the first is the evaluation split) and its hub source."""

    name: str
    splits: Mapping[str, Split]
    hub: HubSource

    @property
    def eval_split(self) -> str:
        """The split tasks evaluate on (the first one)."""
        return next(iter(self.splits))
