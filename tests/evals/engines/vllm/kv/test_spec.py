"""evals.engines.vllm.kv.spec: QA_VLLM_KV carries the spec as resolved.json keeps it (quant.kv.spec's JSON pair)
and is read back, and checked, by one function (spec_from_env); what vLLM cannot honour is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.engines.vllm.kv.spec import (
    PLUGIN_ENV,
    RAY_COPY_ENV,
    RECORD_ENV,
    check_vllm_kv,
    plugin_env,
    spec_from_env,
)
from evals.errors import EngineError
from quant.kv.spec import kv_spec_from_dict, kv_spec_to_json

SPEC = kv_spec_from_dict({"format": "qa_int4", "skip_layers": [0], "layer_formats": {2: "qa_int8"}})


def test_the_switch_carries_the_spec_as_resolved_json_keeps_it(tmp_path: Path) -> None:
    env = plugin_env(SPEC, tmp_path, ray_extra="A,QA_VLLM_KV")
    assert json.loads(env[PLUGIN_ENV]) == kv_spec_to_json(SPEC)
    assert spec_from_env(env) == SPEC
    assert env[RECORD_ENV] == str(tmp_path) and env[RAY_COPY_ENV] == "A,QA_VLLM_KV,QA_VLLM_KV_RECORD"
    assert spec_from_env({}) is None and spec_from_env({PLUGIN_ENV: " "}) is None  # unset or empty: off
    assert spec_from_env({PLUGIN_ENV: '{"format": "none"}'}) == kv_spec_from_dict({"format": "none"})  # by hand


@pytest.mark.parametrize(("raw", "match"), [
    ("{nvfp4", r"^QA_VLLM_KV: not JSON \("),
    ('["nvfp4"]', r"^QA_VLLM_KV: kv cache spec: a JSON object"),
    ('{"format": "nvfp5"}', r"^QA_VLLM_KV: kv cache spec: format: "),
    ('{"format": "nvfp4"}', r"^QA_VLLM_KV: kv cache spec: scales = 'dynamic' with nvfp4: .*no per-sequence scale"),
])
def test_an_environment_the_plugin_cannot_run_is_one_line(raw: str, match: str) -> None:
    with pytest.raises(EngineError, match=match) as err:
        spec_from_env({PLUGIN_ENV: raw})
    assert "\n" not in str(err.value)


def test_the_check_names_where_it_ran() -> None:
    with pytest.raises(EngineError, match=r"^arm 'c': vllm server: kv cache spec: kv_cache_dtype 'fp8' .* twice"):
        check_vllm_kv(SPEC, "fp8", where="arm 'c': vllm server")
    check_vllm_kv(SPEC, "auto")  # honoured: nothing raised
