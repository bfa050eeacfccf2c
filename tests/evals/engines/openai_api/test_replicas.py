"""Replicas (`base_urls`): requests spread over two real local servers, a dead replica's requests
retried on the live one, a replica stopped mid-run; every sample answered exactly once, in request
order. Against the scripted server on 127.0.0.1 only."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from evals.engines import parse_engine_args
from evals.engines.base import GenerateRequest, GenerateResult
from evals.errors import EngineError
from evals.servers.process import free_port
from tests.evals.engines.openai_api.fake_server import FakeServer, engine_at


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[FakeServer, FakeServer]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = FakeServer(tmp_path / "a"), FakeServer(tmp_path / "b")
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


def _completions(server: FakeServer) -> Counter[str]:
    return Counter(str(r["prompt"]) for r in server.requests() if r["path"] == "/v1/completions")


def _generate(urls: list[str], prompts: list[str], **extra: object) -> list[object]:
    engine = engine_at(urls[0], **{"base_url": None, "base_urls": urls, **extra})
    try:
        return list(engine.generate([GenerateRequest(prompt=p, max_tokens=4, until=(" STOP",)) for p in prompts]))
    finally:
        engine.close()


def test_base_url_xor_base_urls_each_a_valid_url() -> None:
    with pytest.raises(EngineError, match="base_url and base_urls: give one"):
        parse_engine_args("openai", {"base_url": "http://127.0.0.1:1/v1", "base_urls": ["http://127.0.0.1:2/v1"]})
    with pytest.raises(EngineError, match="'ftp://127.0.0.1/v1' must look like http://HOST:PORT/v1"):
        parse_engine_args("openai", {"base_urls": ["http://127.0.0.1:1/v1", "ftp://127.0.0.1/v1"]})
    with pytest.raises(EngineError, match="must look like"):
        parse_engine_args("openai", {"base_urls": ["http://127.0.0.1:99999/v1"]})
    with pytest.raises(EngineError, match="lists a replica twice"):
        parse_engine_args("openai", {"base_urls": ["http://127.0.0.1:1/v1", "http://127.0.0.1:1/v1"]})
    args = parse_engine_args("openai", {"base_urls": ["http://127.0.0.1:1/v1/", "http://127.0.0.1:2/v1"]})
    assert args.replica_urls() == ("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1")  # type: ignore[union-attr]


def test_requests_spread_over_replicas_in_order(two: tuple[FakeServer, FakeServer]) -> None:
    a, b = two
    prompts = [f"spread {i}" for i in range(12)]
    results = _generate([a.base_url, b.base_url], prompts, concurrency=4)
    assert [r.text for r in results] == [" out:" + p[::-1] for p in prompts]  # type: ignore[attr-defined]
    on_a, on_b = _completions(a), _completions(b)
    assert on_a + on_b == Counter(prompts)  # each sample sent once, to one replica
    assert len(on_a) == len(on_b) == 6  # round robin by request number


def test_a_dead_replica_loses_no_sample(fake: FakeServer) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    prompts = [f"failover {i}" for i in range(10)]
    started = time.monotonic()
    results = _generate([dead, fake.base_url], prompts, max_retries=2)
    assert all(isinstance(r, GenerateResult) for r in results), results
    assert [r.text for r in results] == [" out:" + p[::-1] for p in prompts]  # type: ignore[attr-defined]
    assert _completions(fake) == Counter(prompts)  # every sample answered once by the live replica
    assert time.monotonic() - started < 20


def test_a_replica_stopped_mid_run(two: tuple[FakeServer, FakeServer]) -> None:
    a, b = two
    prompts = [f"midway {i}" for i in range(40)]

    def stop_a() -> None:  # once a has answered a few requests
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(_completions(a)) < 3:
            time.sleep(0.01)
        a.stop()

    thread = threading.Thread(target=stop_a, daemon=True)
    thread.start()
    results = _generate([a.base_url, b.base_url], prompts, concurrency=2, max_retries=3)
    thread.join(timeout=30)
    assert all(isinstance(r, GenerateResult) for r in results), [r for r in results if not isinstance(r, GenerateResult)]
    assert [r.text for r in results] == [" out:" + p[::-1] for p in prompts]  # type: ignore[attr-defined]
    on_a, on_b = _completions(a), _completions(b)
    assert 3 <= len(on_a) < len(prompts) and set(on_a) | set(on_b) == set(prompts)
    assert on_b.total() >= len(prompts) - on_a.total()  # what a could not answer, b did
