"""check_served_requests: what a served arm would refuse or ignore on every sample is refused before anything runs."""

from __future__ import annotations

import pytest

from evals.errors import EngineError
from evals.tasks import get_task
from qa.run.arm_inputs import task_options
from qa.run.dry_run import check_served_requests
from qa.files.spec import RunSpec, parse_spec
from tests.shared_data import shared_data_dir

BASE = """
name = "served"
[arms.baseline]
engine = "hf"
[arms.candidate]
engine = "openai"
"""


def _first(spec: RunSpec) -> list:
    out = []
    for t in spec.tasks:
        task = get_task(t.name, task_options(t, spec.chat), spec.model)
        out.append((t.name, task, task.items(shared_data_dir())[0]))
    return out


def _check(text: str) -> None:
    spec = parse_spec(BASE + text)
    check_served_requests(spec, _first(spec))


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
