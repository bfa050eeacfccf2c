"""Engines by name. Each module exposes `build(model: ResolvedModel, args: Mapping[str, Any]) -> Engine`;
heavy optional dependencies (vllm, a server package) are imported lazily inside that one module."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from difflib import get_close_matches
from typing import Any

from evals.engines.base import Engine
from evals.errors import EngineError
from evals.models import ResolvedModel

ENGINES: dict[str, str] = {
    "hf": "evals.engines.hf",
    "vllm": "evals.engines.vllm_engine",
    "openai": "evals.engines.openai_engine",
}


def build_engine(name: str, model: ResolvedModel, args: Mapping[str, Any]) -> Engine:
    """Build the named engine for `model` with its engine arguments (validated by the engine module)."""
    if name not in ENGINES:
        close = get_close_matches(name, list(ENGINES), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; choose one of {', '.join(ENGINES)}"
        raise EngineError(f"unknown engine {name!r}{hint}")
    module = importlib.import_module(ENGINES[name])
    return module.build(model, args)
