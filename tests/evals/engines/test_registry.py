"""The engine registry (evals/engines/__init__.py): names, argument models parsed once, dispatch, and
an import that loads no engine."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest

from evals.engines import (
    ENGINE_NAMES,
    ENGINES,
    args_model,
    build_engine,
    check_engine_name,
    parse_engine_args,
)
from evals.engines.args import EngineArgs
from evals.engines.hf.args import HFEngineArgs
from evals.engines.openai_api.args import OpenAIArgs
from evals.engines.vllm.args import VllmEngineArgs
from evals.errors import EngineError
from evals.models.resolve import ResolvedModel

NO_MODEL = ResolvedModel(name="fake", path=None, hub_id="fake/none", file_hash=None)


def test_every_name_has_an_args_model_a_parser_and_a_builder() -> None:
    assert set(ENGINES) == set(ENGINE_NAMES) == {"hf", "vllm", "openai"}
    models = {name: args_model(name) for name in ENGINE_NAMES}
    assert models == {"hf": HFEngineArgs, "vllm": VllmEngineArgs, "openai": OpenAIArgs}
    assert set(get_args(EngineArgs)) == set(models.values())
    for name, model in models.items():
        parsed = parse_engine_args(name, {})
        assert type(parsed) is model and parsed.model_config.get("frozen")


def test_unknown_names_and_keys_are_one_line_errors_with_did_you_mean() -> None:
    with pytest.raises(EngineError, match="unknown engine 'opnai'; did you mean 'openai'"):
        check_engine_name("opnai")
    with pytest.raises(EngineError, match="unknown engine 'x'.*choose one of"):
        parse_engine_args("x", {})
    with pytest.raises(EngineError, match="did you mean 'served_model'"):
        parse_engine_args("openai", {"served_modle": "m"})
    with pytest.raises(EngineError, match="did you mean 'batch_size'"):
        parse_engine_args("hf", {"batch_sise": 2})


def test_build_refuses_another_engines_arguments() -> None:
    with pytest.raises(EngineError, match="engine 'openai' takes OpenAIArgs, got VllmEngineArgs"):
        build_engine("openai", NO_MODEL, VllmEngineArgs())
    with pytest.raises(EngineError, match="base_url: required"):  # parsed, then built: the builder's own check
        build_engine("openai", NO_MODEL, {"concurrency": 1})


def test_importing_the_registry_loads_no_engine() -> None:
    code = ("import sys, evals.engines, evals.engines.base; "
            "print(sorted({'torch', 'httpx', 'vllm', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
