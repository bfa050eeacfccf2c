"""`qa run --dry-run` refuses, from the model's config.json alone (no weights), a vLLM arm that asks the qa_kv
plugin to emulate the KV cache of a model whose attention it cannot rewrite (DeepSeek-V4.1's own
DeepseekV4Attention), and says so in one line; a Llama config is not refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.engines.vllm.kv.spec import architecture_refusal
from evals.errors import EngineError
from evals.servers.interpreter import VLLM_PYTHON_ENV
from qa import api
from qa.files.spec import parse_spec
from tests.shared_data import shared_data_dir

KV = 'kv = { format = "nvfp4", scales = "constant", constant_scale = 0.004 }'


def _spec(model: Path, with_kv: bool) -> str:
    args = f"{{ max_model_len = 2048, {KV} }}" if with_kv else "{ max_model_len = 2048 }"
    return (f'name = "v41"\nmodel = "{model}"\n[[tasks]]\nname = "gsm8k"\nlimit = 2\n'
            f'[arms.baseline]\nengine = "vllm"\nengine_args = {{ max_model_len = 2048 }}\n'
            f'[arms.candidate]\nengine = "vllm"\nengine_args = {args}\n')


@pytest.fixture
def v41(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding only a DeepSeek-V4.1 config.json (its own config code, as the hub folder has: no weights)."""
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "no-python"))  # no vLLM asked: the refusal needs none
    folder = tmp_path / "DeepSeek-V4.1-Flash"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["DeepseekV41ForCausalLM"],
                                                    "model_type": "deepseek_v41", "num_hidden_layers": 4,
                                                    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV4Config"}}))
    return folder


def test_the_dry_run_refuses_an_emulated_cache_on_deepseek_v41(v41: Path) -> None:
    with pytest.raises(EngineError, match="arm 'candidate'.*DeepseekV41ForCausalLM's attention is "
                                          "DeepseekV4Attention.*cannot emulate") as err:
        api.dry_run(parse_spec(_spec(v41, with_kv=True)), data_dir=shared_data_dir("gsm8k"))
    assert "\n" not in str(err.value)


def test_a_model_vllm_attention_runs_is_not_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert architecture_refusal(path) is None
    assert architecture_refusal(tmp_path / "absent.json") is None  # nothing to read: the plugin checks at load
