"""A tiny scripted OpenAI-compatible server on 127.0.0.1 (faults, echo with hand-computable
log-probs), run as a child process that can be stopped by pid and restarted on the same port."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from evals.engines import parse_engine_args
from evals.engines.lmeval_tokens import PairTokenizer
from evals.engines.openai_api.args import OpenAIArgs
from evals.engines.openai_api.client import api_key_from_env
from evals.engines.openai_api.completions import OpenAIEngine
from evals.models.resolve import ResolvedModel
from evals.servers.process import free_port, stop_pid

# The scripted server. Prompt markers choose the behaviour; every request is appended to LOG as
# one JSON line {"prompt", "auth", "path", "body", "inflight"} before it is answered ("inflight": the POSTs
# being answered, this one included, until its answer goes out). MODE "vllm" names vLLM as the owner in /v1/models and serves /metrics
# with vLLM's scheduler gauges (the POSTs in flight as running); /v1/chat/completions answers the last message
# (THINK: with a separate reasoning_content; CUT: reasoning only, stopped at max_tokens). A body with
# ignore_eos (a load filler) takes 10 ms per max_tokens.
FAKE_SERVER = r"""
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, LOG, MODE = int(sys.argv[1]), sys.argv[2], sys.argv[3]
seen = {}
inflight = [0]
lock = threading.Lock()
METRICS = '''# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="fake-model"} %d
vllm:num_requests_waiting{engine="0",model_name="fake-model"} 0
vllm:kv_cache_usage_perc{engine="0",model_name="fake-model"} %f
vllm:num_preemptions_total{engine="0",model_name="fake-model"} 0
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="64"} 1.0
'''

def logprob(pos):
    return -pos / 10.0  # hand-computable: position p (p >= 1) has log-prob -p/10

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def done(self):  # a POST's answer is about to go out: it stops counting as in flight
        if getattr(self, "counted", False):
            self.counted = False
            with lock:
                inflight[0] -= 1

    def send(self, code, body, headers=()):
        self.done()
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
            owner = {"owned_by": "vllm"} if MODE == "vllm" else {}
            return self.send(200, {"data": [{"id": "fake-model", **owner}]})
        if self.path == "/metrics" and MODE == "vllm":
            data = (METRICS % (inflight[0], inflight[0] / 10)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return self.wfile.write(data)
        self.send(404, {"error": "no"})

    def do_POST(self):
        with lock:
            inflight[0] += 1
            now = inflight[0]
        self.counted = True
        try:
            self.answer(now)
        finally:
            self.done()

    def answer(self, now):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body.get("prompt")
        with open(LOG, "a") as fh:
            fh.write(json.dumps({"prompt": prompt, "auth": self.headers.get("Authorization"),
                                 "path": self.path, "body": body, "inflight": now}) + "\n")
        if body.get("ignore_eos"):
            time.sleep(0.01 * body["max_tokens"])
        if self.path == "/v1/chat/completions":
            last = body["messages"][-1]["content"]
            message = {"role": "assistant", "content": " re:" + last + " STOP tail"}
            finish = "stop"
            if "THINK" in last:
                message = {"role": "assistant", "content": " 42", "reasoning_content": "6 times 7"}
            if "CUT" in last:
                message, finish = {"role": "assistant", "content": None, "reasoning": "6 times"}, "length"
            return self.send(200, {"choices": [{"index": 0, "message": message, "finish_reason": finish}],
                                   "usage": {"completion_tokens": body["max_tokens"]}})
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


# A model with no files: enough for generation-only tests (the engine loads a tokenizer only for
# log-prob requests).
NO_MODEL = ResolvedModel(name="fake", path=None, hub_id="fake/none", file_hash=None)


def engine_at(url: str, *, tokenizer: PairTokenizer | None = None, **extra: object) -> OpenAIEngine:
    """An `openai` engine for `url` with short retries and timeouts (`extra` overrides them)."""
    args = {"base_url": url, "concurrency": 3, "max_retries": 3, "backoff_base_s": 0.05, "backoff_max_s": 0.2,
            "timeout_s": 5.0, **extra}
    parsed = parse_engine_args("openai", args)
    assert isinstance(parsed, OpenAIArgs)
    return OpenAIEngine(NO_MODEL, parsed, api_key=api_key_from_env(parsed), tokenizer=tokenizer)


class CharTokenizer:
    """One token per character (id = code point): the fake server's ids, and lm-eval's context split
    by hand."""

    bos_token_id = None
    eos_token_id = 3

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]
