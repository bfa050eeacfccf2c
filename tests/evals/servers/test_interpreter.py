"""evals.servers.interpreter: the one vLLM-interpreter finder ($QA_VLLM_PYTHON, this interpreter, the repo's
.venv-vllm, else the install hint)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import evals.servers.interpreter
from evals.errors import EngineError
from evals.servers.commands import vllm_server_command
from evals.servers.interpreter import REPO_VLLM_PYTHON, VLLM_PYTHON_ENV, vllm_python
from evals.servers.spec import VllmServerSpec


def test_vllm_python_prefers_the_explicit_choice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    chosen = tmp_path / "python"
    chosen.touch()
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(chosen))
    assert vllm_python() == str(chosen)
    assert vllm_server_command(VllmServerSpec(model=tmp_path), 8000)[0] == str(chosen)
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "missing"))
    with pytest.raises(EngineError, match="does not exist"):
        vllm_python()


def test_vllm_python_then_this_interpreter_then_the_repo_venv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(VLLM_PYTHON_ENV, raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "vllm" else None)
    assert vllm_python() == sys.executable
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    venv = tmp_path / ".venv-vllm" / "bin" / "python"
    monkeypatch.setattr(evals.servers.interpreter, "REPO_VLLM_PYTHON", venv)
    with pytest.raises(EngineError, match=r"scripts/setup.sh --vllm.*QA_VLLM_PYTHON"):
        vllm_python()
    venv.parent.mkdir(parents=True)
    venv.touch()
    assert vllm_python() == str(venv)
    assert REPO_VLLM_PYTHON.parts[-3:] == (".venv-vllm", "bin", "python")
    assert REPO_VLLM_PYTHON.parents[2] == Path(__file__).resolve().parents[3]  # in the repository's root
