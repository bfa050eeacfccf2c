"""The scripted server, started for a test and stopped after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.evals.engines.openai_api.fake_server import FakeServer


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeServer]:
    server = FakeServer(tmp_path)
    server.start()
    yield server
    server.stop()
