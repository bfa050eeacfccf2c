"""The qa_kv plugin is switched on only by an arm's or a server's kv table: an arm without one runs plain
even when the environment `qa run` started in sets QA_VLLM_KV, and a server `env` that sets it is refused
(it would switch the plugin on with no record checked)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from evals.engines.vllm.kv.spec import PLUGIN_ENV
from evals.engines.vllm.kv.switch import plugin_off
from evals.errors import EngineError
from evals.servers.commands import server_env
from evals.servers.spec import VllmServerSpec
from quant.kv.spec import kv_spec_from_dict, kv_spec_from_json

NVFP4 = kv_spec_from_dict({"format": "nvfp4", "scales": "constant", "constant_scale": 0.004})


def test_an_arm_without_a_kv_table_runs_with_the_switch_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLUGIN_ENV, '{"format": "nvfp4"}')
    with plugin_off() as folder:
        assert folder is None and PLUGIN_ENV not in os.environ
    assert os.environ[PLUGIN_ENV] == '{"format": "nvfp4"}'  # restored after the block


def test_a_server_without_a_kv_table_drops_an_inherited_switch(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    monkeypatch.setenv(PLUGIN_ENV, '{"format": "nvfp4"}')
    assert PLUGIN_ENV not in server_env(VllmServerSpec(model=tmp_path))
    served = server_env(VllmServerSpec(model=tmp_path, kv=NVFP4))
    assert kv_spec_from_json(json.loads(served[PLUGIN_ENV])) == NVFP4


def test_a_server_env_that_sets_the_switch_is_refused_in_one_line(tmp_path: Path) -> None:
    for kv in (None, NVFP4):
        with pytest.raises(EngineError) as err:
            server_env(VllmServerSpec(model=tmp_path, env={PLUGIN_ENV: '{"format": "nvfp4"}'}, kv=kv))
        assert PLUGIN_ENV in str(err.value) and "\n" not in str(err.value)
