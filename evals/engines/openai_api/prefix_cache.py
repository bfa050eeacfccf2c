"""The prefix cache of an OpenAI-compatible server, as the sessions probe drives it (PrefixCacheControl).

Warm is by order: a request right after its prefix was served finds it in the server's cache. Cold,
per server kind:
- vLLM: POST /reset_prefix_cache (a development endpoint: start the server with VLLM_SERVER_DEV_MODE=1
  in the arm's env, else it answers 404 and the reset is a one-line EngineError saying so);
- SGLang: POST /flush_cache;
- llama.cpp: the requests of the next engine call carry `cache_prompt: false` (its server keeps one KV
  per slot and reuses the longest common prefix unless told not to);
- any other server: no reset (EngineError: the probe cannot serve a cold path there).

Counters: vLLM's /metrics counters `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total`
(tokens, summed over the replicas); where a server has none, the responses' own numbers
(`usage.prompt_tokens_details.cached_tokens`, llama.cpp's `timings.cache_n`) summed by this engine
(source "counted from responses"); a server that reports neither gives source "none".
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from pydantic import JsonValue

from evals.engines.base import PrefixCacheStats
from evals.engines.openai_api.sampling import ServerKind
from evals.errors import EngineError

RESET_PATHS: dict[ServerKind, str] = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}
VLLM_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
DEV_MODE_HINT = "set env = { VLLM_SERVER_DEV_MODE = \"1\" } on the arm so vLLM serves /reset_prefix_cache"


def server_root(url: str) -> str:
    """The server's root URL (where /metrics lives) from an API base URL ending in /v1."""
    return url[: -len("/v1")] if url.rstrip("/").endswith("/v1") else url.rstrip("/")


def prometheus_counters(text: str, names: Sequence[str]) -> dict[str, float]:
    """Sum of each named counter over its label sets in a Prometheus text exposition."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        metric, _, value = line.rpartition(" ")
        name = metric.split("{", 1)[0]
        if name in names:
            try:
                found[name] = found.get(name, 0.0) + float(value)
            except ValueError:
                continue
    return found


def response_tokens(body: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(prompt tokens, prompt tokens served from the cache) a completion response reports, None where not."""
    usage = body.get("usage") if isinstance(body.get("usage"), Mapping) else {}
    prompt = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    timings = body.get("timings")
    if cached is None and isinstance(timings, Mapping):  # llama.cpp: cache_n reused, prompt_n computed
        cached = timings.get("cache_n")
        if prompt is None and isinstance(cached, int) and isinstance(timings.get("prompt_n"), int):
            prompt = cached + timings["prompt_n"]
    return (prompt if isinstance(prompt, int) else None, cached if isinstance(cached, int) else None)


class ServerPrefixCache:
    """Reset and count one deployment's prefix cache (every replica)."""

    def __init__(self, kind: ServerKind, urls: Sequence[str], clients: Sequence[httpx.Client]) -> None:
        self.kind = kind
        self._roots = [server_root(u) for u in urls]
        self._clients = list(clients)
        self._lock = threading.Lock()
        self._cold_next = False
        self._queried = self._hits = 0
        self._counted_any = False

    def reset(self) -> None:
        """Empty the cache of every replica, or (llama.cpp) serve the next call's requests uncached."""
        if self.kind == "llamacpp":
            with self._lock:
                self._cold_next = True
            return
        path = RESET_PATHS.get(self.kind)
        if path is None:
            raise EngineError(f"a {self.kind!r} server has no prefix-cache reset; the sessions probe needs one for "
                              "its cold path (vLLM, SGLang or llama.cpp)")
        for root, http in zip(self._roots, self._clients, strict=True):
            try:
                resp = http.post(root + path, json={})  # no arguments (a JSON body every server parses)
            except httpx.HTTPError as exc:
                raise EngineError(f"{root}{path}: {type(exc).__name__}: {exc}") from None
            if resp.status_code == 404 and self.kind == "vllm":
                raise EngineError(f"{root}{path}: 404; {DEV_MODE_HINT}")
            if resp.status_code != 200:
                raise EngineError(f"{root}{path}: HTTP {resp.status_code}: {resp.text[:200]}")

    def request_extras(self) -> dict[str, JsonValue]:
        """Keys every request of the coming engine call carries (llama.cpp: cache_prompt); clears a pending cold."""
        if self.kind != "llamacpp":
            return {}
        with self._lock:
            cold, self._cold_next = self._cold_next, False
        return {"cache_prompt": not cold}

    def count(self, prompt_tokens: int | None, cached_tokens: int | None) -> None:
        """Add one response's numbers to the counted fallback."""
        if prompt_tokens is None or cached_tokens is None:
            return
        with self._lock:
            self._queried += prompt_tokens
            self._hits += cached_tokens
            self._counted_any = True

    def stats(self) -> PrefixCacheStats:
        """vLLM's /metrics counters (summed over replicas), else the responses' own numbers, else source "none"."""
        if self.kind == "vllm":
            totals = dict.fromkeys(VLLM_COUNTERS, 0.0)
            for root, http in zip(self._roots, self._clients, strict=True):
                try:
                    resp = http.get(root + "/metrics")
                except httpx.HTTPError as exc:
                    raise EngineError(f"{root}/metrics: {type(exc).__name__}: {exc}") from None
                found = prometheus_counters(resp.text, VLLM_COUNTERS) if resp.status_code == 200 else {}
                if len(found) < len(VLLM_COUNTERS):
                    break
                for name, value in found.items():
                    totals[name] += value
            else:
                return PrefixCacheStats(queried_tokens=int(totals[VLLM_COUNTERS[0]]),
                                        hit_tokens=int(totals[VLLM_COUNTERS[1]]), source="server /metrics")
        with self._lock:
            if self._counted_any:
                return PrefixCacheStats(queried_tokens=self._queried, hit_tokens=self._hits,
                                        source="counted from responses")
        return PrefixCacheStats(queried_tokens=0, hit_tokens=0, source="none")
