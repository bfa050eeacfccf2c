"""`qa run --dry-run` with the K/V format emulated in vLLM (the qa_kv plugin): how the plugin is switched on
beside each arm's engine arguments or server command line, what vLLM cannot honour refused in one line
before any arm starts, and the DeepSeek-V4.1-Flash example for hardware without NVFP4."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from evals.engines.vllm.kv.spec import PLUGIN_ENV
from evals.errors import EngineError
from evals.servers.interpreter import VLLM_PYTHON_ENV
from qa import api
from qa.errors import SpecError
from qa.files.spec import load_spec, parse_spec
from qa.pipeline.dry_run import PlannedArm
from quant.kv.spec import KVQuantSpec, kv_spec_from_dict, kv_spec_from_json, kv_spec_to_json
from tests.shared_data import shared_data_dir
from tests.vllm_env import vllm_python_or_skip

ROOT = Path(__file__).resolve().parents[3]
HEAD = 'name = "dry"\nmodel = "smollm2-135m"\n[[tasks]]\nname = "gsm8k"\nlimit = 2\n[arms.baseline]\nengine = "vllm"\n'
OFFLINE = ('[arms.offline]\nengine = "vllm"\nengine_args = { max_model_len = 2048, kv = { format = "nvfp4", '
           'scales = "constant", constant_scale = 0.004 } }\n')
SERVED = ('[arms.served]\nengine = "openai"\nserver = { kind = "vllm", args = { max_model_len = 2048 }, '
          'kv = { format = "qa_int4", skip_layers = [0] } }\n')
EXAMPLE = ROOT / "examples" / "deepseek_v4_flash_emulated_kv.toml"


def _plan(text: str) -> dict[str, PlannedArm]:
    return {a.name: a for a in api.dry_run(parse_spec(text), data_dir=shared_data_dir()).arms}


def _switch(arm: PlannedArm) -> KVQuantSpec:
    """The kv spec the arm's plugin note says QA_VLLM_KV carries."""
    [note] = [n for n in arm.notes if n.startswith("K/V format emulated in vLLM by the qa_kv plugin")]
    variables = note.split("switched on with ", 1)[1].rsplit(" for ", 1)[0]
    assignment = next(w for w in shlex.split(variables) if w.startswith(PLUGIN_ENV))
    return kv_spec_from_json(json.loads(assignment.split("=", 1)[1]))


def test_the_plugin_switch_is_shown_beside_each_arm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "no-python"))  # no vLLM: the dry run still shows it
    plan = _plan(HEAD.replace("engine_args", "") + OFFLINE + SERVED)
    assert not [n for n in plan["baseline"].notes if "qa_kv" in n]  # no kv table: the plugin stays off
    assert _switch(plan["offline"]) == kv_spec_from_dict({"format": "nvfp4", "scales": "constant", "constant_scale": 0.004})
    assert "kv" not in plan["offline"].engine_args  # vLLM's LLM(...) never sees it
    int4 = kv_spec_from_dict({"format": "qa_int4", "skip_layers": [0]})
    assert _switch(plan["served"]) == int4
    served = plan["served"].server
    assert served is not None
    words = shlex.split(served["command"])
    assert words[0].startswith(f"{PLUGIN_ENV}=")  # the command's own prefix: the spec as resolved.json keeps it
    assert json.loads(words[0].split("=", 1)[1]) == kv_spec_to_json(int4)
    assert words[1] == "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY=QA_VLLM_KV,QA_VLLM_KV_RECORD"  # Ray workers get both
    assert words[3:5] == ["-m", "vllm.entrypoints.openai.api_server"]


@pytest.mark.parametrize(("arm", "match"), [
    (('[arms.c]\nengine = "vllm"\nengine_args = { kv = { format = "nvfp4", recent_window = 8, scales = "constant", '
     'constant_scale = 1.0 } }\n'), "FP8 recent window is the hf engine's"),
    ('[arms.c]\nengine = "vllm"\nengine_args = { kv = { format = "qa_int8", prefix_cache = { block = 16 } } }\n',
     "hf engine's prefix cache"),
    ('[arms.c]\nengine = "vllm"\nengine_args = { kv = { format = "fp8_e4m3" } }\n', "no per-sequence scale"),
    ('[arms.c]\nengine = "vllm"\nengine_args = { kv_cache_dtype = "fp8", kv = { format = "qa_mxfp4" } }\n',
     "quantized twice"),
    ('[arms.c]\nengine = "openai"\nserver = { kind = "llamacpp", kv = { format = "qa_int4" } }\n',
     "kv: not a setting of a llamacpp server"),
    (('[arms.c]\nengine = "vllm"\nengine_args = { kv = { format = "nvfp4", profile = "flashinfer-nvfp4", scales = '
     '"constant", constant_scale = 1.0 } }\n'), "models an attention kernel in the hf engine"),
])
def test_what_vllm_cannot_honour_is_one_line_before_any_arm_starts(arm: str, match: str) -> None:
    with pytest.raises(SpecError, match=match) as err:
        parse_spec(HEAD + arm)
    assert "\n" not in str(err.value)


def test_a_served_kv_vllm_cannot_honour_is_refused_once_where_the_run_is_resolved(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "no-python"))
    served = ('[arms.c]\nengine = "openai"\nserver = { kind = "vllm", args = { kv_cache_dtype = "fp8" }, kv = { '
              'format = "qa_int4" } }\n')
    spec = parse_spec(HEAD + served)  # the table parses: the check is resolve's (evals.engines.vllm.kv.spec)
    with pytest.raises(EngineError, match=r"^arm 'c': vllm server: kv cache spec: .*quantized twice") as err:
        api.dry_run(spec, data_dir=shared_data_dir())
    assert "\n" not in str(err.value)


def test_the_deepseek_example_emulates_nvfp4_on_the_candidates_that_name_it(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "no-python"))
    spec = load_spec(EXAMPLE)
    assert spec.candidates == ["nvfp4_kv", "replay", "nvfp4_kv_and_replay"] and "rerun" in spec.arms
    plan = {a.name: a for a in api.dry_run(EXAMPLE, data_dir=shared_data_dir("gsm8k")).arms}
    base = plan["baseline"].engine_args
    assert base["tensor_parallel_size"] == 8 and base["kv_cache_dtype"] == "auto"
    want = {"nvfp4_kv": (True, False), "replay": (False, True), "nvfp4_kv_and_replay": (True, True), "rerun": (False, False)}
    for name, (emulated, replay) in want.items():
        arm = plan[name]
        differs = {k for k in base if arm.engine_args.get(k) != base[k]}
        assert differs == ({"swa_bounded_replay"} if replay else set())  # vLLM's own flags: only replay moves
        notes = [n for n in arm.notes if "qa_kv plugin" in n]
        assert bool(notes) == emulated
        if emulated:
            assert _switch(arm) == kv_spec_from_dict({"format": "nvfp4", "scales": "static",
                                                      "scales_file": "/models/DeepSeek-V4.1-Flash-NVFP4"})


@pytest.mark.vllm
def test_vllm_refuses_a_plugin_left_out_by_vllm_plugins() -> None:
    vllm_python_or_skip()
    served = SERVED.replace('engine = "openai"\n', 'engine = "openai"\nenv = { VLLM_PLUGINS = "none" }\n')
    with pytest.raises(Exception, match="VLLM_PLUGINS='none' leaves the qa_kv plugin out") as err:
        _plan(HEAD + served)
    assert "\n" not in str(err.value)


@pytest.mark.vllm
def test_vllm_checks_the_example_and_notes_the_scales_it_cannot_read_here() -> None:
    vllm_python_or_skip()
    plan = {a.name: a for a in api.dry_run(EXAMPLE, data_dir=shared_data_dir("gsm8k")).arms}
    notes = plan["nvfp4_kv"].notes
    assert any(n.startswith("arguments checked by vLLM 0.") for n in notes)
    assert any("are not on this machine: read where the arm runs" in n for n in notes)
