"""An OpenAI-compatible server's prefix cache as the sessions probe drives it: vLLM's /metrics counters
parsed from Prometheus text, a response's cached-token numbers (OpenAI usage, llama.cpp timings), the
llama.cpp cold call (cache_prompt false once), the counted fallback and the one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.engines.base import GenerateRequest, GenerateResult
from evals.engines.openai_api.prefix_cache import (
    ServerPrefixCache,
    prometheus_counters,
    response_tokens,
    server_root,
)
from evals.errors import EngineError
from tests.evals.engines.openai_api.fake_server import FakeServer, engine_at

# the lines vLLM 0.32's server writes for the two counters (one label set per engine)
METRICS = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 2173.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 27.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1024.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9
"""


def test_prometheus_counters_are_summed_over_label_sets() -> None:
    found = prometheus_counters(METRICS, ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"))
    assert found == {"vllm:prefix_cache_queries_total": 2200.0, "vllm:prefix_cache_hits_total": 1024.0}
    assert prometheus_counters("garbage line\n", ("x",)) == {}


def test_response_tokens_from_usage_or_llamacpp_timings() -> None:
    openai = {"usage": {"prompt_tokens": 600, "prompt_tokens_details": {"cached_tokens": 512}}}
    assert response_tokens(openai) == (600, 512)
    assert response_tokens({"usage": {"prompt_tokens": 600}}) == (600, None)
    assert response_tokens({"timings": {"cache_n": 90, "prompt_n": 10}}) == (100, 90)
    assert response_tokens({}) == (None, None)


def test_server_root() -> None:
    assert server_root("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000"
    assert server_root("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"


def test_llamacpp_reset_makes_the_next_call_cold_once_and_counts_from_responses() -> None:
    cache = ServerPrefixCache("llamacpp", [], [])
    assert cache.stats().source == "none" and cache.stats().hit_rate is None
    assert cache.request_extras() == {"cache_prompt": True}
    cache.reset()
    assert cache.request_extras() == {"cache_prompt": False}
    assert cache.request_extras() == {"cache_prompt": True}
    cache.count(100, 90)
    cache.count(50, None)  # a response without the number is not counted
    stats = cache.stats()
    assert (stats.queried_tokens, stats.hit_tokens, stats.source) == (100, 90, "counted from responses")


def test_a_server_without_a_reset_is_a_one_line_error() -> None:
    with pytest.raises(EngineError, match="has no prefix-cache reset") as err:
        ServerPrefixCache("openai", [], []).reset()
    assert "\n" not in str(err.value)


def test_on_a_served_vllm_kind_reset_needs_dev_mode_and_stats_say_none(tmp_path: Path) -> None:
    server = FakeServer(tmp_path, "vllm")  # a real local server naming vLLM as owner, without the dev routes
    server.start()
    try:
        engine = engine_at(server.base_url)
        assert engine.server_kind == "vllm"
        with pytest.raises(EngineError, match="reset_prefix_cache: 404; set env = .*VLLM_SERVER_DEV_MODE") as err:
            engine.reset_prefix_cache()
        assert "\n" not in str(err.value)
        [res] = engine.generate([GenerateRequest(prompt="hello", max_tokens=2)])
        assert isinstance(res, GenerateResult) and res.cached_tokens is None  # the server reports none
        assert engine.prefix_cache_stats().source == "none"  # no /metrics counters, no numbers counted
        engine.close()
    finally:
        server.stop()


def test_llamacpp_kind_sends_cache_prompt_false_on_the_call_after_a_reset(tmp_path: Path) -> None:
    server = FakeServer(tmp_path)
    server.start()
    try:
        engine = engine_at(server.base_url, server_kind="llamacpp")
        req = GenerateRequest(prompt="hello", max_tokens=2)
        engine.generate([req])
        engine.reset_prefix_cache()
        engine.generate([req, req])
        engine.generate([req])
        engine.close()
        sent = [r["body"].get("cache_prompt") for r in server.requests() if r["path"] == "/v1/completions"]
        assert sent == [True, False, False, True]
    finally:
        server.stop()
