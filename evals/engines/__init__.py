"""Engines by name. Each module exposes `build(model: ResolvedModel, args: Mapping[str, Any]) -> Engine`;
heavy optional dependencies (vllm, a server package) are imported lazily inside that one module."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from evals.engines.base import Engine
from evals.errors import EngineError
from evals.models import ResolvedModel
from quant.validation import did_you_mean

ENGINES: dict[str, str] = {
    "hf": "evals.engines.hf",
    "vllm": "evals.engines.vllm_engine",
    "openai": "evals.engines.openai_engine",
}


def build_engine(name: str, model: ResolvedModel, args: Mapping[str, Any]) -> Engine:
    """Build the named engine for `model` with its engine arguments (validated by the engine module)."""
    if name not in ENGINES:
        raise EngineError(f"unknown engine {name!r}; {did_you_mean(name, ENGINES, listing='choose one of')}")
    module = importlib.import_module(ENGINES[name])
    return module.build(model, args)
