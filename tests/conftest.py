"""Fixtures every test package shares: the tiny random models of `tests.tiny_models` (built once per session;
tests must not change their weights)."""

from __future__ import annotations

import pytest

from tests.tiny_models import tiny_gemma3, tiny_llama


@pytest.fixture(scope="session")
def llama():  # -> LlamaForCausalLM
    """The tiny random Llama (TINY_LLAMA, seed 0)."""
    return tiny_llama()


@pytest.fixture(scope="session")
def gemma():  # -> Gemma3ForCausalLM
    """The tiny random Gemma-3 with a sliding-window layer (TINY_GEMMA3, seed 0)."""
    return tiny_gemma3()
