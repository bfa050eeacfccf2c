"""The hub fallback (no data dir given): `datasets.load_dataset` with each dataset's canonical id,
offline unless asked (evals.offline.hub_offline: HF_DATASETS_OFFLINE or HF_HUB_OFFLINE set to a false
value), rows given the same ids as the local readers give them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from evals.data.files import DATA_DIR_ENV, index_ids
from evals.data.spec import DatasetSpec, Row
from evals.errors import DataError
from evals.offline import hub_mode, hub_offline


def _hub_rows(spec: DatasetSpec, rows: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Hub rows with the ids the local readers give: the id field, subject/index (MMLU), else the index."""
    hub = spec.hub
    if hub.id_field is not None:
        return [{**r, "id": str(r[hub.id_field])} for r in rows]
    if spec.name == "mmlu":
        seen: dict[str, int] = {}
        out = []
        for r in rows:
            i = seen[r["subject"]] = seen.get(r["subject"], -1) + 1
            out.append({**r, "id": f"{r['subject']}/{i}"})
        return out
    return index_ids(dict(r) for r in rows)


def load_hub(spec: DatasetSpec, split: str) -> list[Row]:
    """Rows of one split from the hub (the local HF cache only while offline); DataError if unavailable."""
    hub = spec.hub
    where = f"{hub.path}" + (f" ({hub.name})" if hub.name else "") + f" split {hub.splits[split]}"
    offline = hub_offline()
    try:
        import datasets  # datasets: only when no data dir is given
    except ImportError:
        raise DataError(
            "hub loading needs the `datasets` package: pip install datasets, or pass --data-dir"
        ) from None
    try:
        with hub_mode(offline):  # offline: only what is already in the local HF cache; never the network
            ds = datasets.load_dataset(hub.path, hub.name, split=hub.splits[split])
    except Exception as exc:  # noqa: BLE001 - the hub client raises many types; all mean "not available"
        how = (
            (
                f"not in the local HF cache (offline); pass --data-dir, set {DATA_DIR_ENV}, or set "
                "HF_DATASETS_OFFLINE=0 to download"
            )
            if offline
            else f"could not be loaded ({type(exc).__name__}); pass --data-dir"
        )
        raise DataError(f"dataset {spec.name!r}: hub dataset {where} {how}") from None
    rows = _hub_rows(spec, ds)
    expected = spec.splits[split].count
    if len(rows) != expected:
        raise DataError(
            f"dataset {spec.name!r}: hub dataset {where} has {len(rows)} items, expected {expected}"
        )
    return rows
