"""qa.pipeline.preflight.check_served_requests: what a served arm would refuse or ignore on every sample is refused before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.errors import EngineError
from qa.files.spec import parse_spec
from qa.pipeline.preflight import check_served_requests
from qa.pipeline.resolve import resolve_run
from tests.shared_data import shared_data_dir

BASE = """
name = "served"
[arms.baseline]
engine = "hf"
[arms.candidate]
engine = "openai"
"""


def _check(text: str) -> None:
    run = resolve_run(parse_spec(BASE + text), Path("unused"), data_dir=shared_data_dir(), spec_dir=None)
    check_served_requests(run)


def test_a_sampling_key_the_server_ignores_is_refused() -> None:
    with pytest.raises(EngineError, match=r"task gsm8k: top_k set, but arm 'candidate'.*'openai' server") as err:
        _check('engine_args = { base_url = "http://127.0.0.1:9/v1", server_kind = "openai" }\n'
               '[[tasks]]\nname = "gsm8k"\ntemperature = 0.7\ntop_k = 20\nstop = ["Question:"]\n')
    assert "\n" not in str(err.value)
    _check('engine_args = { base_url = "http://127.0.0.1:9/v1", server_kind = "vllm" }\n'
           '[[tasks]]\nname = "gsm8k"\ntemperature = 0.7\ntop_k = 20\n')  # vLLM honours top_k
    _check('engine_args = { base_url = "http://127.0.0.1:9/v1" }\n'  # kind unknown: checked when the arm starts
           '[[tasks]]\nname = "gsm8k"\ntop_k = 20\ntemperature = 0.7\n')


def test_a_scoring_task_on_a_chat_endpoint_is_refused() -> None:
    with pytest.raises(EngineError, match="task arc_easy: a chat endpoint cannot score"):
        _check('engine_args = { base_url = "http://127.0.0.1:9/v1", api = "chat" }\n[[tasks]]\nname = "arc_easy"\n')


def test_more_stop_strings_than_a_vllm_server_takes_are_refused_unless_raised() -> None:
    server = 'server = { kind = "vllm" }\n'
    with pytest.raises(EngineError, match="5 stop strings.*VLLM_MAX_STOP_STRINGS = 4"):
        _check(server + '[[tasks]]\nname = "gsm8k_cot_llama"\n')
    _check(server + 'env = { VLLM_MAX_STOP_STRINGS = "8" }\n[[tasks]]\nname = "gsm8k_cot_llama"\n')
