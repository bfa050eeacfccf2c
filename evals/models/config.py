"""A model folder's config.json, read by transformers: one-line errors for one that is not a valid config."""

from __future__ import annotations

import json
from pathlib import Path

from evals.errors import ModelError, one_line


def read_model_config(path: Path, trust_remote_code: bool = False):  # -> transformers.PretrainedConfig
    """A model folder's transformers config; ModelError (one line) when its config.json is not a valid one."""
    from transformers import AutoConfig  # transformers: only where a model's config is read

    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - a wrong-typed field, a missing model_type, not JSON: bad input
        raise ModelError(f"{path / 'config.json'}: not a valid model config: {one_line(exc)}") from None


def check_config_json(path: Path) -> None:
    """ModelError (one line) when a local folder's config.json is not a JSON object transformers accepts (its
    field types included); a config that needs the folder's own code (auto_map) is checked when it is loaded."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path / 'config.json'}: not valid JSON: {one_line(exc)}") from None
    if not isinstance(config, dict):
        raise ModelError(f"{path / 'config.json'}: expected a JSON object, got {type(config).__name__}")
    if "auto_map" not in config:
        read_model_config(path)
