"""The amax a model folder's K/V scales were fitted against, kept between processes: `qa run`'s preflight
observes it once (qa.pipeline.scale_fit) and the arm's provenance, in the arm's own process, reads it back
so that arm.json records the same fit (quant.scales.folder.resolve_folder_scales with it).

A record is `$QA_CACHE_DIR/kv-scale-fits/<key>.json` (an ObservedAmax), the key a sha256 of the model's name
and of the folder's stored scale numbers: the observation belongs to that model, and it is only reused for
the same numbers. A missing or unreadable record is no fit (the provenance then says so)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import ValidationError

from evals.models.cache import cache_root
from quant.fileio import atomic_write_text
from quant.scales.folder import FolderScales, ObservedAmax

FITS_DIR = "kv-scale-fits"


def fit_path(scales: FolderScales, model: str) -> Path:
    """Where the observation for `model` and these stored numbers is kept."""
    key = hashlib.sha256(f"{model}\0{scales.values_sha256()}".encode()).hexdigest()[:32]
    return cache_root() / FITS_DIR / f"{key}.json"


def save_observed(scales: FolderScales, model: str, observed: ObservedAmax) -> Path:
    """Keep `observed` for `model` and these numbers (atomically); returns the record's path."""
    path = fit_path(scales, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, observed.model_dump_json() + "\n")
    return path


def load_observed(scales: FolderScales, model: str) -> ObservedAmax | None:
    """The kept observation for `model` and these numbers; None when there is none or it does not read."""
    path = fit_path(scales, model)
    try:
        return ObservedAmax.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError):
        return None
