"""The proof that the qa_kv rewrites ran in a vLLM server that `qa run` started with a `kv` table
(evals.servers.start): the same per-layer device counts as an offline arm (plugin.load_counts, evals.engines.
vllm.kv.proof), checked against the tokens the server computed for the arm.

How they are read (vLLM 0.32), at the `openai` engine's start and at its close:
- the counts: POST /collective_rpc {"method": COUNTS_METHOD} runs the plugin's method on every worker
  (vllm/entrypoints/serve/dev/rpc/api_router.py). It is a development endpoint, served only with
  VLLM_SERVER_DEV_MODE=1, which start_server sets for such a server; the server listens on 127.0.0.1 only.
- the tokens computed: vLLM's own iteration counters on GET /metrics (v1/metrics/loggers.py, stats.py), over
  the arm: `vllm:prompt_tokens_total` less `vllm:prompt_tokens_cached_total` (each request's prompt less its
  cached tokens, the num_cached_tokens an offline RequestOutput carries, counted at its first output) plus
  `vllm:generation_tokens_total` less `vllm:time_to_first_token_seconds_count` (every generated token but each
  request's last, which is never fed back). The server serves this arm alone, so nothing else is counted.
- the configuration that makes the count inexact: GET /server_info?config_format=json (async scheduling,
  speculative decoding, data-parallel ranks), also a development endpoint.
Not exact, as offline (proof.TokenTally): preemptions (`vllm:num_preemptions_total`), a request finished
other than by stop or length (`vllm:request_success_total` by finished_reason), a stop string (a response's
`stop_reason` is a string: the server aborts the request after the engine may have run on), async scheduling
with a request ended by a stop, speculative decoding, several data-parallel ranks, and a request attempt the
client gave up on or retried (the server may have computed tokens no counter shows). A server that keeps
no stats (disable_log_stats) leaves only a lower bound: one token per answered prompt.

A server the toolkit did not start (an arm's own base_url) is not counted: its counters may include other
clients' requests and its development endpoints are not the toolkit's to switch on, so such an arm has no
`kv_execution`. Only a server registered here by start_server (`mark_counted`) is.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from evals.engines.openai_api.prefix_cache import server_root
from evals.engines.vllm.kv.proof import TokenTally, checked_execution, counted_since, parse_counts
from evals.engines.vllm.kv.record import COUNTS_METHOD, KVExecution, LoadCounts
from evals.errors import EngineError

DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"  # "1": vLLM serves /collective_rpc and /server_info
RPC_TIMEOUT_S = 60.0  # the workers' answer to collective_rpc (they read one counter per layer)
TOTALS = {  # the /metrics counters read, by their exposition names
    "prompt": "vllm:prompt_tokens_total",
    "cached": "vllm:prompt_tokens_cached_total",
    "generated": "vllm:generation_tokens_total",
    "started": "vllm:time_to_first_token_seconds_count",  # one per request that produced its first token
    "preemptions": "vllm:num_preemptions_total",
}
FINISHED = "vllm:request_success_total"  # labelled by finished_reason
REASON_LABEL = re.compile(r'finished_reason="([^"]*)"')
EXACT_FINISHES = frozenset({"stop", "length"})

COUNTED: set[str] = set()  # base URLs of the running vLLM servers this process started with the plugin on


def mark_counted(base_url: str) -> None:
    """Register a server this process started with a `kv` table and its development endpoints on."""
    COUNTED.add(base_url.rstrip("/"))


def unmark_counted(base_url: str) -> None:
    """Forget a server once it is stopped (its port may be reused by another)."""
    COUNTED.discard(base_url.rstrip("/"))


def is_counted(base_url: str) -> bool:
    """Whether `base_url` is a running server registered by `mark_counted`."""
    return base_url.rstrip("/") in COUNTED


@dataclass(frozen=True)
class ServerTotals:
    """vLLM's cumulative counters of what a server computed (its /metrics); None: the server keeps no stats."""

    prompt: int
    cached: int
    generated: int
    started: int
    preemptions: int
    finished: Mapping[str, int]  # requests finished, by finished_reason


def parse_totals(text: str) -> ServerTotals | None:
    """The counters in a Prometheus text exposition, each summed over its label sets (engines); None when one
    is missing (a server started with disable_log_stats)."""
    sums: dict[str, float] = {}
    finished: dict[str, int] = {}
    names = set(TOTALS.values())
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        metric, _, value = line.rpartition(" ")
        name = metric.split("{", 1)[0]
        try:
            number = float(value)
        except ValueError:
            continue
        if name in names:
            sums[name] = sums.get(name, 0.0) + number
        elif name == FINISHED and (reason := REASON_LABEL.search(metric)) is not None:
            finished[reason.group(1)] = finished.get(reason.group(1), 0) + int(number)
    if not names <= sums.keys():
        return None
    return ServerTotals(**{key: int(sums[name]) for key, name in TOTALS.items()}, finished=finished)


@dataclass(frozen=True)
class ServedConfig:
    """What of a server's resolved configuration decides whether its count is exact (None: not known)."""

    async_scheduling: bool | None
    speculative: bool | None
    dp_ranks: int


def parse_config(body: Any) -> ServedConfig:
    """The parts of GET /server_info?config_format=json that matter here (unknown where it does not say)."""
    config = body.get("vllm_config") if isinstance(body, Mapping) else None
    if not isinstance(config, Mapping):
        return ServedConfig(async_scheduling=None, speculative=None, dp_ranks=1)
    scheduler, parallel = config.get("scheduler_config"), config.get("parallel_config")
    async_scheduling = scheduler.get("async_scheduling") if isinstance(scheduler, Mapping) else None
    speculative = (config["speculative_config"] is not None) if "speculative_config" in config else None
    dp = parallel.get("data_parallel_size") if isinstance(parallel, Mapping) else None
    return ServedConfig(async_scheduling=async_scheduling if isinstance(async_scheduling, bool) else None,
                        speculative=speculative, dp_ranks=dp if isinstance(dp, int) and dp > 0 else 1)


def served_tally(before: ServerTotals | None, after: ServerTotals | None, config: ServedConfig, *,
                 answered: int, stop_strings: int, failed_attempts: int) -> TokenTally:
    """The tokens the server computed between two readings of its counters (a lower bound, and whether exact);
    `answered`: prompts the responses answered, `stop_strings`: those a stop string ended, `failed_attempts`:
    request attempts that failed or timed out."""
    tally = TokenTally()
    if before is None or after is None:
        tally.tokens = tally.requests = answered  # each answered prompt computed at least its last token
        tally.not_exact("the server keeps no token counters (disable_log_stats): one token per answered prompt")
    else:
        tally.requests = after.started - before.started
        tally.tokens = (after.prompt - before.prompt) - (after.cached - before.cached)
        tally.tokens += (after.generated - before.generated) - tally.requests
        if (preempted := after.preemptions - before.preemptions) > 0:
            tally.preempted(preempted)
        for reason in sorted(after.finished.keys() - EXACT_FINISHES):
            if after.finished[reason] > before.finished.get(reason, 0):
                tally.not_exact(f"a request finished by {reason}")
        if after.finished.get("stop", 0) > before.finished.get("stop", 0) and config.async_scheduling is not False:
            tally.not_exact("async scheduling with a request ended by a stop token" if config.async_scheduling
                            else "async scheduling not known (GET /server_info)")
    if stop_strings:
        tally.not_exact("a stop string ended a request (the engine may have run on until the abort)")
    if failed_attempts:
        tally.not_exact(f"{failed_attempts} request attempts failed (the server may have computed tokens "
                        "no counter shows)")
    if config.speculative is not False:
        if config.speculative:
            tally.speculative()
        else:
            tally.not_exact("speculative decoding not known (GET /server_info)")
    return tally


def stop_reason_strings(body: Mapping[str, Any]) -> tuple[int, int]:
    """(choices, choices a stop string ended) in a completion or chat completion response (vLLM's
    `stop_reason`: the stop string, a stop token's id, or None)."""
    choices = body.get("choices")
    if not isinstance(choices, list):
        return 0, 0
    return len(choices), sum(1 for c in choices if isinstance(c, Mapping) and isinstance(c.get("stop_reason"), str))


@dataclass
class ServedWatch:
    """The counts and counters of a counted server at the start of an arm, and its responses, checked at its end."""

    http: httpx.Client
    root: str
    before: list[LoadCounts]
    totals: ServerTotals | None
    config: ServedConfig
    answered: int = 0
    stop_strings: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(cls, http: httpx.Client, base_url: str) -> ServedWatch:
        """Start watching the server at `base_url` through `http` (its requests so far are left out)."""
        root = server_root(base_url)
        config = parse_config(get_json(http, f"{root}/server_info", {"config_format": "json"}, required=False))
        return cls(http=http, root=root, before=read_server_counts(http, root), totals=read_totals(http, root),
                   config=config)

    def response(self, body: Mapping[str, Any]) -> None:
        """Note one completion or chat response (its prompts answered, those a stop string ended)."""
        answered, stopped = stop_reason_strings(body)
        with self._lock:
            self.answered += answered
            self.stop_strings += stopped

    def finish(self, failed_attempts: int = 0) -> KVExecution:
        """Every layer's counts since `start`, checked against the tokens the server computed."""
        after = read_server_counts(self.http, self.root)
        tally = served_tally(self.totals, read_totals(self.http, self.root), self.config, answered=self.answered,
                             stop_strings=self.stop_strings, failed_attempts=failed_attempts)
        return checked_execution(counted_since(self.before, after), tally, dp_ranks=self.config.dp_ranks)


def get_json(http: httpx.Client, url: str, params: Mapping[str, str] | None = None, *,
             required: bool = True) -> Any:
    """GET `url`'s JSON body; EngineError (or None when not `required`) when it does not answer 200 with JSON."""
    try:
        resp = http.get(url, params=params, timeout=RPC_TIMEOUT_S)
        if resp.status_code == 200:
            return resp.json()
        problem = f"HTTP {resp.status_code}"
    except (httpx.HTTPError, ValueError) as exc:
        problem = type(exc).__name__
    if required:
        raise EngineError(f"{url}: {problem}; cannot check the qa_kv plugin's counts")
    return None


def read_totals(http: httpx.Client, root: str) -> ServerTotals | None:
    """The server's token counters (GET /metrics; None: it keeps none); EngineError when it does not answer."""
    try:
        resp = http.get(f"{root}/metrics", timeout=RPC_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise EngineError(f"{root}/metrics: {type(exc).__name__}; cannot check the qa_kv plugin's counts") from None
    return parse_totals(resp.text) if resp.status_code == 200 else None


def read_server_counts(http: httpx.Client, root: str) -> list[LoadCounts]:
    """Every worker's per-layer counters (POST /collective_rpc COUNTS_METHOD); EngineError when the server does
    not answer them (its development endpoints off: VLLM_SERVER_DEV_MODE=1)."""
    url = f"{root}/collective_rpc"
    try:
        resp = http.post(url, json={"method": COUNTS_METHOD, "timeout": RPC_TIMEOUT_S}, timeout=RPC_TIMEOUT_S + 10)
    except httpx.HTTPError as exc:
        raise EngineError(f"{url}: {type(exc).__name__}; cannot read the qa_kv plugin's counts") from None
    if resp.status_code == 404:
        raise EngineError(f"{url}: 404; the server was started without {DEV_MODE_ENV}=1, so the qa_kv plugin's "
                          "counts cannot be read")
    try:
        answers = resp.json()["results"] if resp.status_code == 200 else None
    except (ValueError, KeyError, TypeError):
        answers = None
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise EngineError(f"{url}: HTTP {resp.status_code}: {resp.text[:200]}; cannot read the qa_kv plugin's counts")
    return parse_counts(answers)
