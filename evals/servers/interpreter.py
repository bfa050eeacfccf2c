"""The interpreter that runs vLLM: vLLM may live in a virtual environment of its own (scripts/setup.sh --vllm),
so a vLLM server, an offline vLLM arm's worker and the vLLM check all start the python this module finds."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from evals.engines.vllm.offline import INSTALL_HINT
from evals.errors import EngineError

VLLM_PYTHON_ENV = "QA_VLLM_PYTHON"  # names the interpreter that runs vLLM
REPO_VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def vllm_python() -> str:
    """The interpreter that runs vLLM (an offline-engine arm's worker, a vLLM server), first found of:
    $QA_VLLM_PYTHON (an explicit choice wins; it must exist), this interpreter if it can import vllm,
    <repo>/.venv-vllm/bin/python (scripts/setup.sh --vllm); else EngineError with the install hint."""
    explicit = os.environ.get(VLLM_PYTHON_ENV)
    if explicit:
        if not Path(explicit).exists():
            raise EngineError(f"{VLLM_PYTHON_ENV}={explicit!r} does not exist; name a python that has vLLM")
        return explicit
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if REPO_VLLM_PYTHON.exists():
        return str(REPO_VLLM_PYTHON)
    raise EngineError(f"{INSTALL_HINT}; or run scripts/setup.sh --vllm (a venv of its own), or set "
                      f"{VLLM_PYTHON_ENV} to a python that has it")
