"""evals.servers.commands: the vLLM command line exactly as vLLM's CLI takes the arguments given (nothing
added, the ones `qa run` sets refused), and the llama.cpp child's command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evals.errors import EngineError
from evals.servers.commands import llamacpp_command, vllm_server_command
from evals.servers.spec import LlamaCppServerSpec, VllmServerSpec


def test_vllm_command_is_exactly_the_arguments_given(tmp_path: Path) -> None:
    spec = VllmServerSpec(model=tmp_path, python="py", args={
        "enable_prefix_caching": False, "enforce_eager": True, "max_model_len": 512,
        "compilation_config": {"mode": 0, "cudagraph_capture_sizes": [1, 2]}, "api_key": "x",
        "allowed_local_media_path": "/tmp/a b", "gpu_memory_utilization": 0.9,
        "middleware": ["a.B", "c.D"],
    })
    cmd = vllm_server_command(spec, 8123)
    assert cmd == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path),
                   "--served-model-name", "model", "--host", "127.0.0.1", "--port", "8123",
                   "--no-enable-prefix-caching", "--enforce-eager", "--max-model-len", "512",
                   "--compilation-config", '{"mode":0,"cudagraph_capture_sizes":[1,2]}', "--api-key", "x",
                   "--allowed-local-media-path", "/tmp/a b", "--gpu-memory-utilization", "0.9",
                   "--middleware", "a.B", "c.D"]
    assert not any("kv-cache-memory" in c for c in cmd)  # nothing added the arm did not ask for


def test_scale_out_flags_pass_through_untouched(tmp_path: Path) -> None:
    args = {"tensor_parallel_size": 4, "data_parallel_size": 2, "enable_expert_parallel": True,
            "distributed_executor_backend": "ray", "kv_cache_memory_bytes": 1 << 30}
    cmd = vllm_server_command(VllmServerSpec(model=tmp_path, python="py", args=args), 1)
    assert cmd[11:] == ["--tensor-parallel-size", "4", "--data-parallel-size", "2", "--enable-expert-parallel",
                        "--distributed-executor-backend", "ray", "--kv-cache-memory-bytes", "1073741824"]


@pytest.mark.parametrize("key", ["model", "port", "host", "served_model_name"])
def test_arguments_the_command_sets_are_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(EngineError, match=f"server argument {key}: set by `qa run`"):
        vllm_server_command(VllmServerSpec(model=tmp_path, python="py", args={key: "x"}), 1)


def test_llamacpp_command_runs_this_package_as_the_child(tmp_path: Path) -> None:
    spec = LlamaCppServerSpec(gguf=tmp_path / "m.gguf", cache_type_k="q8_0", cache_type_v="nvfp4", n_ctx=4096,
                              n_parallel=2, threads=3, served_model_name="smol")
    assert llamacpp_command(spec, 8124) == [
        sys.executable, "-m", "evals.servers", "llamacpp", "--gguf", str(tmp_path / "m.gguf"), "--port", "8124",
        "--cache-type-k", "q8_0", "--cache-type-v", "nvfp4", "--flash-attn", "on", "--n-ctx", "4096",
        "--n-parallel", "2", "--threads", "3", "--alias", "smol"]
    with pytest.raises(EngineError, match=r"needs flash attention for a quantized V cache \(nvfp4\)"):
        llamacpp_command(LlamaCppServerSpec(gguf=tmp_path / "m.gguf", cache_type_v="nvfp4", flash_attn=False), 1)
    with pytest.raises(EngineError, match="unknown llama.cpp KV cache type 'q8'; did you mean 'q8_0'"):
        llamacpp_command(LlamaCppServerSpec(gguf=tmp_path / "m.gguf", cache_type_k="q8"), 1)


def test_the_llamacpp_child_takes_its_command_line() -> None:
    """`python -m evals.servers llamacpp` (what llamacpp_command starts) parses the flags it is given."""
    ok = subprocess.run([sys.executable, "-m", "evals.servers", "llamacpp", "--help"], capture_output=True,
                        text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "usage: python -m evals.servers llamacpp" in ok.stdout and "--cache-type-k" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "evals.servers", "llamacpp", "--gguf", "m.gguf", "--port", "1",
                          "--cache-type-k", "q8"], capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "invalid choice: 'q8'" in bad.stderr
