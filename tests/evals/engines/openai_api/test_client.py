"""The HTTP client under faults (through the engine): the key, redirects, retries, timeouts, seeded
backoff, a server killed and restarted mid-run; against the scripted server on 127.0.0.1 only."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from evals.engines.base import Failure, GenerateRequest, GenerateResult
from evals.records.samples import read_records
from evals.run.runner import run_task
from evals.tasks.base import Item, Scored
from tests.evals.engines.openai_api.fake_server import FakeServer, engine_at


def test_api_key_is_sent_but_never_recorded(fake: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("QA_TEST_API_KEY", secret)
    engine = engine_at(fake.base_url, api_key_env="QA_TEST_API_KEY")
    try:
        [res] = engine.generate([GenerateRequest(prompt="hello", max_tokens=4)])
    finally:
        engine.close()
    assert isinstance(res, GenerateResult)
    assert {r["auth"] for r in fake.requests()} == {f"Bearer {secret}"}  # /models and /completions
    assert secret not in repr(engine.info) and secret not in repr(engine.args)
    assert engine.info.details["served_model"] == "fake-model"


def test_redirects_are_not_followed(fake: FakeServer) -> None:
    engine = engine_at(fake.base_url)
    try:
        [res] = engine.generate([GenerateRequest(prompt="REDIRECT me")])
    finally:
        engine.close()
    assert isinstance(res, Failure) and "HTTP 307" in res.error
    assert [r["path"] for r in fake.requests() if "REDIRECT" in str(r["prompt"])] == ["/v1/completions"]


def test_generate_keeps_request_order_and_cuts_at_stop(fake: FakeServer) -> None:
    prompts = [f"prompt number {i}" for i in range(12)]
    engine = engine_at(fake.base_url)
    try:
        results = engine.generate([GenerateRequest(prompt=p, max_tokens=9, until=(" STOP",)) for p in prompts])
    finally:
        engine.close()
    assert [r.text for r in results] == [" out:" + p[::-1] for p in prompts]  # type: ignore[union-attr]
    assert all(r.output_tokens == 9 and r.finish_reason == "length" for r in results)  # type: ignore[union-attr]


def test_transient_errors_are_retried_and_permanent_ones_are_not(fake: FakeServer) -> None:
    engine = engine_at(fake.base_url, max_retries=3)
    try:
        flaky, bad, poison = engine.generate([GenerateRequest(prompt=p) for p in ("FLAKY one", "BAD one", "POISON")])
    finally:
        engine.close()
    attempts: dict[str, int] = {}
    for r in fake.requests():
        attempts[str(r["prompt"])] = attempts.get(str(r["prompt"]), 0) + 1
    assert isinstance(flaky, GenerateResult) and attempts["FLAKY one"] == 3  # two 503s, then 200
    assert isinstance(bad, Failure) and bad.error.startswith("HTTP 400") and attempts["BAD one"] == 1
    assert isinstance(poison, Failure) and "HTTP 500" in poison.error and "after 4 attempts" in poison.error
    assert attempts["POISON"] == 4


def test_timeout_is_per_request_and_becomes_a_failure(fake: FakeServer) -> None:
    engine = engine_at(fake.base_url, timeout_s=0.5, max_retries=1)
    t0 = time.monotonic()
    try:
        slow, quick = engine.generate([GenerateRequest(prompt="SLOW"), GenerateRequest(prompt="quick")])
    finally:
        engine.close()
    assert isinstance(slow, Failure) and "timed out after 0.5 s" in slow.error
    assert isinstance(quick, GenerateResult)
    assert time.monotonic() - t0 < 2.9  # two 0.5 s timeouts and a short backoff, not the 3 s sleep


def test_backoff_is_exponential_capped_and_seeded(fake: FakeServer) -> None:
    a = engine_at(fake.base_url, seed=7, backoff_base_s=1.0, backoff_max_s=5.0)
    b = engine_at(fake.base_url, seed=7, backoff_base_s=1.0, backoff_max_s=5.0)
    c = engine_at(fake.base_url, seed=8, backoff_base_s=1.0, backoff_max_s=5.0)
    try:
        waits = [a.client.backoff_s(3, k) for k in range(5)]
        assert waits == [b.client.backoff_s(3, k) for k in range(5)]
        assert waits != [c.client.backoff_s(3, k) for k in range(5)]
        for k, w in enumerate(waits):  # jitter factor in [0.5, 1) of min(5, 2**k)
            cap = min(5.0, 2.0**k)
            assert 0.5 * cap <= w < cap
    finally:
        for e in (a, b, c):
            e.close()


def _restart_after(fake: FakeServer, n_requests: int) -> threading.Thread:
    """A thread that stops the server after `n_requests` arrived (waiting at most 20 s), and 1 s later
    starts it again on the same port."""

    def chaos() -> None:
        deadline = time.monotonic() + 20
        while len(fake.requests()) < n_requests and time.monotonic() < deadline:
            time.sleep(0.01)
        fake.stop()
        time.sleep(1.0)
        fake.start()

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    return thread


def test_server_stopped_and_restarted_mid_run(fake: FakeServer, caplog: pytest.LogCaptureFixture) -> None:
    """Engine faults: the server dies after some requests and comes back 1 s later; retries with
    backoff carry every request through; a request that never succeeds is a Failure in its slot."""
    prompts = [f"item {i}" for i in range(30)] + ["POISON item"]
    engine = engine_at(fake.base_url, concurrency=2, max_retries=6, backoff_base_s=0.2, backoff_max_s=1.0,
                       timeout_s=3.0)
    caplog.set_level(logging.INFO, logger="evals.engines.openai_api.client")
    thread = _restart_after(fake, 8)
    try:
        results = engine.generate([GenerateRequest(prompt=p, max_tokens=3) for p in prompts])
    finally:
        thread.join(timeout=30)
        engine.close()
    assert len(set(fake.pids)) == 2
    assert [r.text for r in results[:-1]] == [" out:" + p[::-1] + " STOP tail" for p in prompts[:-1]]  # type: ignore[union-attr]
    assert isinstance(results[-1], Failure) and "HTTP 500" in results[-1].error
    assert any("connection failed" in m for m in caplog.messages), "no request saw the outage"


@dataclass(frozen=True)
class EchoTask:
    """A tiny generative task for the runner: the fake server answers " out:" + reversed prompt."""

    name: str = "echo"
    version: str = "1"
    kind: str = "generate"

    def items(self, data_dir: Path | None) -> list[Item]:
        words = [f"word{i}" for i in range(16)] + ["POISON"]
        return [Item(item_id=f"i{i}", doc={"text": w}) for i, w in enumerate(words)]

    def request(self, item: Item, *, repeat: int, seed: int) -> GenerateRequest:
        return GenerateRequest(prompt=str(item.doc["text"]), max_tokens=4, until=(" STOP",), seed=seed)

    def prompt_text(self, request: GenerateRequest) -> str:  # type: ignore[override]
        return request.prompt

    def score(self, item: Item, result: GenerateResult) -> Scored:  # type: ignore[override]
        target = " out:" + str(item.doc["text"])[::-1]
        return Scored(scores={"exact_match,none": float(result.text == target)}, target=target)


def test_runner_survives_a_restart_and_records_the_sample_that_still_fails(fake: FakeServer, tmp_path: Path) -> None:
    """End to end through the runner: the server is stopped by pid and restarted mid-run; the run
    completes; the one sample that keeps failing is recorded with its error and no score (what the
    policy's error budget counts), never scored as wrong."""
    engine = engine_at(fake.base_url, concurrency=2, max_retries=6, backoff_base_s=0.2, backoff_max_s=1.0)
    thread = _restart_after(fake, 5)
    out = tmp_path / "records" / "candidate" / "echo.jsonl"
    try:
        summary = run_task(engine, EchoTask(), arm="candidate", out_path=out, chunk=8, progress=False)
    finally:
        thread.join(timeout=30)
        engine.close()
    assert len(set(fake.pids)) == 2  # it really was restarted
    records = read_records(out)
    assert summary.written == 17 and summary.errors == 1 and len(records) == 17
    failed = [r for r in records if r.error is not None]
    assert [r.item_id for r in failed] == ["i16"]
    assert "HTTP 500" in failed[0].error and all(v is None for v in failed[0].scores.values())  # type: ignore[operator]
    assert all(r.scores == {"exact_match,none": 1.0} for r in records if r.error is None)
