"""Engines by name: each name's argument model (parsed once, by `parse_engine_args`) and the module
whose `build(model, args)` makes the engine. Importing this package loads no engine module: the
argument models and the engines (with their heavy optional dependencies) are imported on first use.

Modules: base (requests, results, the Engine protocol), args (EngineArgs: the union of the models),
lmeval_tokens (lm-eval's context/continuation split), stops (lm-eval's stop-string cut), kv_provenance
(the KV cache and scales a built engine ran with); packages: hf/
(transformers + the emulated KV cache), vllm/ (vLLM's offline LLM, its argument checks and the qa_kv
plugin), openai_api/ (any OpenAI-compatible server).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from pydantic import BaseModel

from evals.engines.base import Engine
from evals.errors import EngineError
from evals.models.resolve import ResolvedModel
from quant.validation import did_you_mean

if TYPE_CHECKING:
    from evals.engines.args import EngineArgs

EngineName = Literal["hf", "vllm", "openai"]
ENGINE_NAMES: tuple[EngineName, ...] = get_args(EngineName)


@dataclass(frozen=True)
class EngineEntry:
    """Where an engine's parts live, as "module:attribute" (imported on first use)."""

    args: str  # its frozen pydantic argument model
    parse: str  # mapping -> that model, one-line EngineError on a bad key or value
    build: str  # (ResolvedModel, args) -> Engine


ENGINES: dict[EngineName, EngineEntry] = {
    "hf": EngineEntry("evals.engines.hf.args:HFEngineArgs", "evals.engines.hf.args:parse_args",
                      "evals.engines.hf:build"),
    "vllm": EngineEntry("evals.engines.vllm.args:VllmEngineArgs", "evals.engines.vllm.args:parse_vllm_args",
                        "evals.engines.vllm.offline:build"),
    "openai": EngineEntry("evals.engines.openai_api.args:OpenAIArgs",
                          "evals.engines.openai_api.args:parse_openai_args",
                          "evals.engines.openai_api.completions:build"),
}


def _load(ref: str) -> object:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def check_engine_name(engine: str) -> EngineName:
    """`engine` as an EngineName; EngineError with a did-you-mean for an unknown one."""
    if engine not in ENGINES:
        hint = did_you_mean(engine, ENGINES, listing="choose one of")
        raise EngineError(f"unknown engine {engine!r}; {hint}")
    return engine  # type: ignore[return-value]  # checked just above


def args_model(engine: str) -> type[BaseModel]:
    """The argument model of the named engine."""
    model = _load(ENGINES[check_engine_name(engine)].args)
    assert isinstance(model, type) and issubclass(model, BaseModel)  # the registry names models
    return model


def parse_engine_args(engine: str, mapping: Mapping[str, object]) -> EngineArgs:
    """One arm's `engine_args` as its engine's argument model; a bad name, key or value is a one-line
    EngineError (with a did-you-mean for an unknown engine or key)."""
    ref = ENGINES[check_engine_name(engine)].parse
    parse: Callable[[Mapping[str, object]], EngineArgs] = _load(ref)  # type: ignore[assignment]
    return parse(mapping)


def build_engine(engine: str, model: ResolvedModel, args: EngineArgs | Mapping[str, object]) -> Engine:
    """Build the named engine for `model`; a mapping (a test, a script) is parsed first."""
    name = check_engine_name(engine)
    parsed = args if isinstance(args, BaseModel) else parse_engine_args(name, args)
    want = args_model(name)
    if not isinstance(parsed, want):
        raise EngineError(f"engine {name!r} takes {want.__name__}, got {type(parsed).__name__}")
    build: Callable[[ResolvedModel, EngineArgs], Engine]
    build = _load(ENGINES[name].build)  # type: ignore[assignment]
    return build(model, parsed)
