"""VllmEngineArgs: vLLM flags passed through as given (typed JSON), the toolkit's own option apart,
and the `vllm.LLM` keyword arguments with the defaults written out; no vllm or torch needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from evals.engines import parse_engine_args
from evals.engines.vllm.args import VllmEngineArgs, check_flag_names, engine_kwargs, parse_vllm_args
from evals.errors import EngineError


def test_flags_pass_through_as_given_and_own_options_stay_apart() -> None:
    given = {"kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": [0, 1], "gpu_memory_utilization": 0.9,
             "max_model_len": 512, "compilation_config": {"level": 0}, "allow_unsupported_kv_cache_dtype": True}
    args = parse_engine_args("vllm", given)
    assert isinstance(args, VllmEngineArgs) and args.allow_unsupported_kv_cache_dtype
    assert args.flags() == {k: v for k, v in given.items() if k != "allow_unsupported_kv_cache_dtype"}
    assert args.model_dump(exclude_unset=True) == given  # what arm.json fingerprints
    assert not parse_vllm_args({}).allow_unsupported_kv_cache_dtype


def test_bad_flags_are_one_line_engine_errors() -> None:
    with pytest.raises(EngineError, match="comes from the spec"):
        parse_vllm_args({"model": "other"})
    with pytest.raises(EngineError, match="allow_unsupported_kv_cache_dtype: Input should be a valid boolean"):
        parse_vllm_args({"allow_unsupported_kv_cache_dtype": "sometimes"})
    with pytest.raises(EngineError, match="vllm engine argument seed: input was not a valid JSON value"):
        parse_vllm_args({"seed": object()})
    known = ["kv_cache_dtype", "max_model_len", "model"]
    check_flag_names(parse_vllm_args({"kv_cache_dtype": "fp8"}), known)
    with pytest.raises(EngineError, match="unknown vllm engine argument 'kv_cache_dtyp'; did you mean 'kv_cache_dtype'"):
        check_flag_names(parse_vllm_args({"kv_cache_dtyp": "fp8"}), known)


def test_engine_kwargs_write_the_defaults_out() -> None:
    cpu = engine_kwargs("m", parse_vllm_args({"kv_cache_dtype": "fp8", "allow_unsupported_kv_cache_dtype": True}),
                        on_cpu=True)
    assert cpu == {
        "kv_cache_dtype": "fp8",
        "seed": 0,
        "kv_cache_memory_bytes": 1 << 30,
        "distributed_executor_backend": "uni",
    }
    gpu = engine_kwargs("m", parse_vllm_args({"tensor_parallel_size": 2, "seed": 5}), on_cpu=False)
    assert gpu == {"tensor_parallel_size": 2, "seed": 5}  # vLLM's own GPU defaults stay vLLM's
    assert "distributed_executor_backend" not in engine_kwargs("m", parse_vllm_args({"data_parallel_size": 2}),
                                                               on_cpu=True)
    with pytest.raises(EngineError, match="engine_args.model: the model comes from the spec"):
        parse_vllm_args({"model": "other"})


def test_the_args_module_imports_neither_vllm_nor_torch() -> None:
    code = "import sys, evals.engines.vllm.args; print(sorted({'vllm', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cli_flags_take_the_forms_vllms_argparse_parses() -> None:
    from evals.engines.vllm.args import cli_flag, cli_flags

    assert cli_flag("enable_prefix_caching", True) == ["--enable-prefix-caching"]
    assert cli_flag("enable_prefix_caching", False) == ["--no-enable-prefix-caching"]  # BooleanOptionalAction
    assert cli_flag("kv_cache_memory_bytes", 1 << 30) == ["--kv-cache-memory-bytes", "1073741824"]
    assert cli_flag("gpu_memory_utilization", 0.9) == ["--gpu-memory-utilization", "0.9"]
    assert cli_flag("hf_overrides", {"rope_theta": 1e6, "a": {"b": [1]}}) == [
        "--hf-overrides", '{"rope_theta":1000000.0,"a":{"b":[1]}}']  # JSON, as its dict type parses
    assert cli_flag("middleware", ["a.B", "c.D"]) == ["--middleware", "a.B", "c.D"]  # nargs="+"
    assert cli_flag("cudagraph_capture_sizes", [1, 2]) == ["--cudagraph-capture-sizes", "1", "2"]
    assert cli_flags({"a_b": "x", "c": True}) == ["--a-b", "x", "--c"]  # in the order given, nothing added
    with pytest.raises(EngineError, match="server argument middleware: an empty list"):
        cli_flag("middleware", [])


def test_offline_data_parallel_is_refused_with_use_a_server() -> None:
    from evals.engines.vllm.args import check_offline_flags, is_gpu_spec

    check_offline_flags({"data_parallel_size": 1, "tensor_parallel_size": 4})
    with pytest.raises(EngineError, match=r"data_parallel_size = 2: .*; use a server: an openai arm with server = \{ kind = \"vllm\""):
        check_offline_flags({"data_parallel_size": 2})
    assert is_gpu_spec({"tensor_parallel_size": 4}) and not is_gpu_spec({"kv_cache_dtype": "fp8"})
