"""Fingerprints: the canonical JSON of a configuration value and its sha256, as arm.json has always
computed them (evals.run.arm); scales files count by their bytes, not by where they lie."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from pydantic import JsonValue

from evals.tasks.base import TaskOptions
from quant.fileio import sha256_file
from quant.scales.folder import scales_files

SCALES_KEYS = ("scales", "scales_file")  # engine arguments naming a file whose bytes are part of the config


def canonical_json(value: object) -> JsonValue:
    """A JSON-able, canonical form of a config value (paths as strings, tuples as lists, dataclasses as
    their fields, anything else as "<TypeName>"); what fingerprints are computed over."""
    if isinstance(value, Mapping):
        return {str(k): canonical_json(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [canonical_json(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: canonical_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


def digest(obj: JsonValue) -> str:
    """sha256 (hex) of the compact, key-sorted JSON of `obj`: a fingerprint."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def scales_file_hashes(args: JsonValue) -> dict[str, str]:
    """sha256 of every file named by a scales argument (nested in `kv` too; a model folder's scale files):
    new scales, new config."""
    found: dict[str, str] = {}

    def visit(prefix: str, obj: JsonValue) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                if k in SCALES_KEYS and isinstance(v, str) and v:
                    for p in scales_files(Path(v)):  # a scales file pair, or a model folder's scale files
                        found[f"{prefix}{k}:{p.name}"] = sha256_file(p)
                else:
                    visit(f"{prefix}{k}.", v)

    visit("", args)
    return found


def scales_by_name(obj: JsonValue) -> JsonValue:
    """`obj` with every scales file named by its file name only: its bytes are fingerprinted by
    `scales_file_hashes`, so a run folder that moves (or a relative path read from another directory)
    still resumes, while new scale values still make a new configuration."""
    if isinstance(obj, dict):
        return {k: Path(v).name if k in SCALES_KEYS and isinstance(v, str) and v else scales_by_name(v)
                for k, v in obj.items()}
    return obj


LEGACY_OPTION_FIELDS = ("num_fewshot", "max_tokens", "temperature", "extra")  # what arm.json always held


def options_identity(options: TaskOptions) -> JsonValue:
    """The canonical JSON of task options as fingerprinted: the four fields arm.json always held (an
    unset temperature as the 0.0 it used to default to) plus every later field that is not at its default,
    so arms written before those fields existed still resume."""
    full = canonical_json(options)
    assert isinstance(full, dict)
    defaults = canonical_json(TaskOptions())
    assert isinstance(defaults, dict)
    kept = {k: v for k, v in full.items() if k in LEGACY_OPTION_FIELDS or v != defaults.get(k)}
    if kept.get("temperature") is None:
        kept["temperature"] = 0.0
    return kept
