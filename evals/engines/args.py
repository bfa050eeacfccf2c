"""EngineArgs: the argument model of any engine (one per engine, chosen by the arm's `engine`).

Its own module so that importing `evals.engines` (the requests, the registry) loads none of the
engines' argument modules; importing this one loads the three models (pydantic only: no torch, vllm or
httpx until a spec is validated).
"""

from __future__ import annotations

from typing import TypeAlias

from evals.engines.hf.args import HFEngineArgs
from evals.engines.openai_api.args import OpenAIArgs
from evals.engines.vllm.args import VllmEngineArgs

EngineArgs: TypeAlias = HFEngineArgs | VllmEngineArgs | OpenAIArgs
