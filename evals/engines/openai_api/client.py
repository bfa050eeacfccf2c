"""HTTP to one OpenAI-compatible deployment (one server, or several replicas of it): bounded thread
pool, per-request timeouts, retries with seeded exponential backoff, and the API key.

Traffic goes only to `base_url` / the `base_urls` replicas (no redirects, no proxy from the
environment). The key is read from the environment variable named by `api_key_env` and lives only in
the client's headers. Transient failures (connection errors, timeouts, 408/409/425/429/5xx) are
retried with exponential backoff and jitter drawn from an RNG seeded by (seed, request number,
attempt); other HTTP errors are not. The client counts the attempts that failed so (`failed_attempts`): the
server may have computed tokens for them that no response shows.

Replicas: request number k starts on replica k mod n (round robin); `concurrency` bounds the requests
in flight over all of them. A replica that fails transiently is skipped by every request until its
backoff has passed, and the failed request's next attempt goes to the next replica at once (no
wait while another replica is up); the attempts of a request are counted over all replicas. Each
request yields exactly one result in its own slot, so a replica's failure never loses or duplicates
a sample, and `map` keeps request order.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import httpx
from pydantic import JsonValue

from evals.engines.base import Failure
from evals.engines.openai_api.args import OpenAIArgs
from evals.errors import EngineError

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})  # worth another try
CONNECT_TIMEOUT_S = 10.0  # connecting takes at most this (or timeout_s when shorter)
T = TypeVar("T")
R = TypeVar("R")


class RequestRejected(Exception):
    """A request failure that another attempt will not fix (HTTP 4xx other than the retry set)."""


class RetriesExhausted(Exception):
    """A transient failure (connection, timeout, 408/429/5xx) that outlasted every retry."""


# What a request may fail with that becomes a Failure in its slot (bad answers raise the other three).
REQUEST_FAILURES = (RequestRejected, RetriesExhausted, ValueError, KeyError, TypeError)


def api_key_from_env(args: OpenAIArgs) -> str | None:
    """The key held by the environment variable `api_key_env` names (None when none is named)."""
    if not args.api_key_env:
        return None
    key = os.environ.get(args.api_key_env)
    if not key:
        raise EngineError(f"environment variable {args.api_key_env} (named by api_key_env) is not set")
    return key


def retry_after_s(resp: httpx.Response) -> float | None:
    """The server's Retry-After header in seconds, when it sent a number."""
    value = resp.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


@dataclass
class Replica:
    """One server of the deployment: its URL, its HTTP client, and until when it is skipped."""

    url: str
    http: httpx.Client
    down_until: float = 0.0  # time.monotonic() before which requests go elsewhere (it just failed)


class ApiClient:
    """One deployment's HTTP clients (a replica each) and worker pool; `map` runs calls concurrently,
    results in order."""

    def __init__(self, args: OpenAIArgs, *, api_key: str | None = None) -> None:
        self.args = args
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.replicas = [
            Replica(url, httpx.Client(
                base_url=url,
                headers=headers,
                follow_redirects=False,
                trust_env=False,
                timeout=httpx.Timeout(args.timeout_s, connect=min(CONNECT_TIMEOUT_S, args.timeout_s)),
                limits=httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency),
            ))
            for url in args.replica_urls()
        ]
        self.base_url = self.replicas[0].url  # the first replica: the one messages name
        self.base_urls = tuple(r.url for r in self.replicas)
        self._pool = ThreadPoolExecutor(max_workers=args.concurrency, thread_name_prefix="openai-engine")
        self._counter = 0  # numbers requests so each one's jitter stream is fixed by the seed
        self._lock = threading.Lock()
        self.failed_attempts = 0  # attempts that failed transiently (timed out, cut off, 408/429/5xx, not JSON)

    def backoff_s(self, key: int, attempt: int) -> float:
        """Seconds to wait before retry `attempt` (0-based) of request `key`: exponential, capped,
        times a jitter factor in [0.5, 1) drawn from an RNG seeded by (seed, key, attempt)."""
        rng = random.Random(f"{self.args.seed}:{key}:{attempt}")
        return min(self.args.backoff_max_s, self.args.backoff_base_s * 2.0**attempt) * (
            0.5 + 0.5 * rng.random()
        )

    def pick(self, key: int, attempt: int) -> Replica:
        """The replica attempt `attempt` of request `key` goes to: from replica (key + attempt) mod n on,
        the first one not skipped (all skipped: that first one)."""
        n = len(self.replicas)
        order = [self.replicas[(key + attempt + i) % n] for i in range(n)]
        now = time.monotonic()
        return next((r for r in order if r.down_until <= now), order[0])

    def request(self, method: str, path: str, key: int, payload: Mapping[str, JsonValue] | None = None, *,
                replica: Replica | None = None) -> JsonValue:
        """One call with retries (over the replicas, or only `replica`); the decoded JSON, or
        RequestRejected / RetriesExhausted."""
        error = ""
        attempts = self.args.max_retries + 1
        for attempt in range(attempts):
            target = replica or self.pick(key, attempt)
            retry_after: float | None = None
            try:
                resp = target.http.request(method, path, json=payload)
            except httpx.TimeoutException:
                error = f"{target.url}: timed out after {self.args.timeout_s:g} s"
            except httpx.TransportError as exc:
                error = f"{target.url}: connection failed ({type(exc).__name__})"
            else:
                if resp.status_code == 200:
                    try:
                        body = resp.json()
                    except ValueError:
                        error = f"{target.url}: the server answered 200 with a body that is not JSON"
                    else:
                        target.down_until = 0.0
                        return body
                elif resp.status_code in RETRY_STATUS:
                    error = f"{target.url}: HTTP {resp.status_code}: {resp.text[:200]}"
                    retry_after = retry_after_s(resp)
                else:
                    raise RequestRejected(f"HTTP {resp.status_code}: {resp.text[:300]}")
            with self._lock:
                self.failed_attempts += 1
            wait = self.backoff_s(key, attempt)
            if retry_after is not None:
                wait = max(wait, min(retry_after, self.args.backoff_max_s))
            target.down_until = time.monotonic() + wait
            if attempt + 1 < attempts:
                following = replica or self.pick(key, attempt + 1)
                if following is target or following.down_until > time.monotonic():
                    log.info("request %d: %s; retry %d/%d in %.2f s", key, error, attempt + 1,
                             self.args.max_retries, wait)
                    time.sleep(wait)
                else:
                    log.info("request %d: %s; retry %d/%d on %s", key, error, attempt + 1,
                             self.args.max_retries, following.url)
        raise RetriesExhausted(f"{error} (gave up after {attempts} attempts)")

    def completion(self, model: str, payload: Mapping[str, JsonValue], key: int) -> Mapping[str, JsonValue]:
        """POST /completions for `model`; the body, which has at least one choice."""
        body = self.request("POST", "/completions", key, {"model": model, **payload})
        if not isinstance(body, Mapping) or not isinstance(body.get("choices"), list) or not body["choices"]:
            raise RequestRejected("the response has no choices")
        return body

    def chat(self, model: str, payload: Mapping[str, JsonValue], key: int) -> Mapping[str, JsonValue]:
        """POST /chat/completions for `model`; the body, which has at least one choice."""
        body = self.request("POST", "/chat/completions", key, {"model": model, **payload})
        if not isinstance(body, Mapping) or not isinstance(body.get("choices"), list) or not body["choices"]:
            raise RequestRejected("the response has no choices")
        return body

    def served_model(self) -> str:
        """The one model GET /models lists (every replica that answers must list the same one);
        EngineError when none answers or they list another number."""
        found: dict[str, list[object]] = {}
        for replica in self.replicas:
            try:
                body = self.request("GET", "/models", key=-1, replica=replica)
            except (RequestRejected, RetriesExhausted) as exc:
                log.warning("cannot list models at %s/models (%s)", replica.url, exc)
                continue
            data = body.get("data", []) if isinstance(body, Mapping) else []
            found[replica.url] = [m.get("id") for m in data if isinstance(m, Mapping)] if isinstance(data, list) else []
        if not found:
            raise EngineError(
                f"cannot list models at {self.base_url}/models; is the server up? Or set served_model"
            )
        url, ids = next(iter(found.items()))
        if len(ids) != 1 or not isinstance(ids[0], str):
            served = ids or "no models"
            raise EngineError(f"the server at {url} serves {served}; name one with served_model")
        other = next((u for u, i in found.items() if i != ids), None)
        if other is not None:
            raise EngineError(f"the replicas serve different models ({url}: {ids}, {other}: {found[other]}); "
                              "base_urls must list replicas of one deployment")
        return ids[0]

    def map(self, fn: Callable[[T, int], R], items: Sequence[T]) -> list[R | Failure]:
        """fn(item, request number) per item on the pool; a REQUEST_FAILURES error becomes its Failure."""
        with self._lock:
            start = self._counter
            self._counter += len(items)

        def guarded(pair: tuple[T, int]) -> R | Failure:
            try:
                return fn(*pair)
            except REQUEST_FAILURES as exc:
                return Failure(error=str(exc) or type(exc).__name__)

        return list(self._pool.map(guarded, zip(items, range(start, start + len(items)))))

    def close(self) -> None:
        """Stop the worker threads and close the connections."""
        self._pool.shutdown(wait=True)
        for replica in self.replicas:
            replica.http.close()
