"""vLLM arguments checked by vLLM itself (evals.engines.vllm.check) in the interpreter that runs vLLM:
server command lines through vLLM's own api_server parser, offline LLM keywords through EngineArgs;
one child process for every check (module-scoped)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from evals.engines.vllm.check import ArmCheck, CheckOutcome, CheckReport, check_with_vllm
from evals.errors import EngineError
from evals.servers.commands import vllm_server_command
from evals.servers.spec import VllmServerSpec
from tests.vllm_env import vllm_python_or_skip

KV_CAP = {"kv_cache_memory_bytes": 1 << 30}


def _server(arm: str, args: dict, *, model: str = "/nonexistent/model", gpu: bool = False,
            env: dict | None = None) -> ArmCheck:
    argv = vllm_server_command(VllmServerSpec(model=Path(model), python="py", args=args), 0)[3:]
    return ArmCheck(arm=arm, kind="server", argv=argv, gpu_spec=gpu, env=env or {})


def _offline(arm: str, kwargs: dict, **extra: object) -> ArmCheck:
    return ArmCheck(arm=arm, kind="offline", kwargs={"model": "/nonexistent/model", **kwargs}, **extra)


CHECKS = [
    _server("good", {"enable_prefix_caching": False, "enforce_eager": True, "max_model_len": 512,
                     "compilation_config": {"mode": 0, "cudagraph_capture_sizes": [1, 2]}, "api_key": "x",
                     "allowed_local_media_path": "/tmp/a b", "middleware": ["a.B", "c.D"], **KV_CAP}),
    _server("typo", {"enable_prefix_cachng": False, **KV_CAP}),
    _server("prefix", {"enable_prefix_cachin": True, **KV_CAP}),  # argparse would take the abbreviation
    _server("not_a_switch", {"max_model_len": False, **KV_CAP}),
    _server("no_cap", {}),
    _server("nvfp4_on_cpu", {"kv_cache_dtype": "nvfp4", **KV_CAP}),
    _server("scale_out", {"tensor_parallel_size": 4, "data_parallel_size": 2, "enable_expert_parallel": True,
                          "distributed_executor_backend": "ray", "kv_cache_dtype": "nvfp4"},
            model="deepseek-ai/DeepSeek-V4.1-Flash", gpu=True),
    _server("bad_env", KV_CAP, env={"VLLM_ATTENTION_BACKEND": "FLASHINFER"}),
    _server("good_env", KV_CAP, env={"VLLM_CPU_KVCACHE_SPACE": "1"}),
    _offline("offline_good", {"kv_cache_dtype": "fp8", "enable_prefix_caching": False, "seed": 0,
                              "compilation_config": {"mode": 0}}),
    _offline("offline_dp", {"data_parallel_size": 2}),
    _offline("offline_typo", {"kv_cache_dtyp": "fp8"}),
    _offline("offline_choice", {"kv_cache_dtype": "nvfp5"}),
    _offline("offline_nvfp4", {"kv_cache_dtype": "nvfp4"}),
    _offline("offline_nvfp4_allowed", {"kv_cache_dtype": "nvfp4"}, allow_unsupported_kv_cache_dtype=True),
]


@pytest.fixture(scope="module")
def report() -> CheckReport:
    return check_with_vllm(CHECKS, vllm_python_or_skip())


def _out(report: CheckReport, arm: str) -> CheckOutcome:
    return next(o for o in report.outcomes if o.arm == arm)


@pytest.mark.vllm
def test_exact_command_lines_parse_and_typos_get_vllms_did_you_mean(report: CheckReport) -> None:
    assert [o.arm for o in report.outcomes] == [c.arm for c in CHECKS]
    assert _out(report, "good") == CheckOutcome(arm="good")
    assert _out(report, "typo").error == ("unknown vLLM argument 'enable_prefix_cachng'; "
                                          "did you mean 'enable_prefix_caching'?")
    assert "unknown vLLM argument 'enable_prefix_cachin'" in (_out(report, "prefix").error or "")
    assert "--max-model-len has no --no- form" in (_out(report, "not_a_switch").error or "")
    no_cap = _out(report, "no_cap")
    assert no_cap.error is None and any("92% of RAM" in n for n in no_cap.notes)
    assert "'nvfp4' is not supported by the attention backend" in (_out(report, "nvfp4_on_cpu").error or "")
    scale_out = _out(report, "scale_out")  # passed through; the KV dtype is the GPU's to check
    assert scale_out.error is None and any("on the GPU" in n for n in scale_out.notes)
    assert "VLLM_ATTENTION_BACKEND" in (_out(report, "bad_env").error or "")
    assert "attention_backend" in (_out(report, "bad_env").error or "")
    assert _out(report, "good_env").error is None
    with pytest.raises(EngineError, match=r"arm 'typo': vLLM 0\.\d+\.\d+ refuses its arguments: unknown"):
        report.raise_first()


@pytest.mark.vllm
def test_offline_keywords_are_checked_against_engine_args(report: CheckReport) -> None:
    assert _out(report, "offline_good") == CheckOutcome(arm="offline_good")
    assert "use a server" in (_out(report, "offline_dp").error or "")
    assert _out(report, "offline_typo").error == ("unknown vllm engine argument 'kv_cache_dtyp'; "
                                                  "did you mean 'kv_cache_dtype'?")
    assert "invalid choice: 'nvfp5'" in (_out(report, "offline_choice").error or "")
    assert "not supported by the attention backend" in (_out(report, "offline_nvfp4").error or "")
    assert _out(report, "offline_nvfp4_allowed").error is None  # run under a loud warning


def test_an_interpreter_without_vllm_is_one_line() -> None:
    with pytest.raises(EngineError, match="cannot run the vLLM argument check in /nonexistent/python"):
        check_with_vllm(CHECKS[:1], "/nonexistent/python")
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(EngineError, match=r"failed \(exit 3\): vllm is not importable here"):
            check_with_vllm(CHECKS[:1], sys.executable)
