"""Fixtures every test package shares: the tiny random models of `tests.tiny_models` (built once per session;
tests must not change their weights). Under pytest-xdist (`-n N`, as scripts/test.sh runs the suite) the
controller first resolves the named models (assembling and converting them under $QA_CACHE_DIR on a first
run), so that the workers start with a warm cache (resolution is safe under concurrency, but each worker
would wait for the first one's conversion), and at the end removes what the workers
shared in its temp folder (tests.llmc_folders); each worker puts the files with a `slow` test first."""

from __future__ import annotations

import shutil

import pytest

from evals.errors import ModelError
from evals.models.named import NAMED_MODELS
from evals.models.resolve import resolve_model
from tests.llmc_folders import SHARED_NAME
from tests.tiny_models import tiny_gemma3, tiny_llama


def _xdist_controller(config: pytest.Config) -> bool:
    """Whether this process hands the tests to pytest-xdist workers (started after pytest_sessionstart)."""
    return (not hasattr(config, "workerinput") and config.getoption("dist", default="no") != "no"
            and bool(config.getoption("tx", default=None)))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist, resolve every installed named model before any worker starts (a model not installed
    in this environment is left to the tests that need it: they say so)."""
    if not _xdist_controller(session.config):
        return
    for name in NAMED_MODELS:
        try:
            resolve_model(name)
        except ModelError:
            pass


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, the files that hold a `slow` test come first, each whole and in collection
    order: under scripts/test.sh's --dist loadfile --no-loadscope-reorder, no worker then starts a file of
    minutes when the other is nearly done. (Every worker sorts the same collection the same way.)"""
    if not hasattr(config, "workerinput"):
        return
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist, remove the folders the workers shared (they have all stopped by now)."""
    factory = getattr(session.config, "_tmp_path_factory", None)  # where pytest-xdist puts worker basetemps
    if _xdist_controller(session.config) and factory is not None:
        shutil.rmtree(factory.getbasetemp() / SHARED_NAME, ignore_errors=True)


@pytest.fixture(scope="session")
def llama():  # -> LlamaForCausalLM
    """The tiny random Llama (TINY_LLAMA, seed 0)."""
    return tiny_llama()


@pytest.fixture(scope="session")
def gemma():  # -> Gemma3ForCausalLM
    """The tiny random Gemma-3 with a sliding-window layer (TINY_GEMMA3, seed 0)."""
    return tiny_gemma3()
