"""Fixtures shared by the HF engine tests."""

from __future__ import annotations

import pytest

from evals.engines.hf.engine import HFEngine
from tests.evals.hf_fixtures import tiny_engine


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    """The tiny-model engine with batch size 4, one per test module (tests may change its state)."""
    return tiny_engine({"batch_size": 4})
