"""Where tests find the interpreter that runs vLLM: evals.servers.vllm_python(), else the test is skipped."""

from __future__ import annotations

import pytest

from evals.errors import EngineError


def vllm_python_or_skip() -> str:
    """The vLLM interpreter; skips the test when vLLM is not installed here, in .venv-vllm or at QA_VLLM_PYTHON."""
    from evals.servers import vllm_python

    try:
        return vllm_python()
    except EngineError:
        pytest.skip("vllm is not installed here, in .venv-vllm, or at QA_VLLM_PYTHON")
