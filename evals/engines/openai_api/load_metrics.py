"""A vLLM server's own scheduler state while a loaded `openai` call runs: GET /metrics read every
SAMPLE_INTERVAL_S on a thread (vLLM 0.32's v1/metrics/loggers.py names, summed over its engines' label sets):
the gauges `vllm:num_requests_running` / `vllm:num_requests_waiting` / `vllm:kv_cache_usage_perc` per reading,
the counter `vllm:num_preemptions_total` read at each call's start and end, and `vllm:cache_config_info`'s
labels (num_gpu_blocks, block_size). A server of another kind, or one that keeps no stats
(disable_log_stats), is not read: `unrecorded` says so.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from evals.engines.openai_api.prefix_cache import server_root

SAMPLE_INTERVAL_S = 0.1
METRICS_TIMEOUT_S = 10.0
RUNNING, WAITING, USAGE = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"
PREEMPTIONS, CACHE_INFO = "vllm:num_preemptions_total", "vllm:cache_config_info"
LABEL = re.compile(r'(\w+)="([^"]*)"')


def metric_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of a Prometheus text exposition: name -> [(labels, value)]."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        metric, _, value = line.rpartition(" ")
        name, _, labels = metric.partition("{")
        try:
            number = float(value)
        except ValueError:
            continue
        found.setdefault(name, []).append((dict(LABEL.findall(labels)), number))
    return found


def _total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    values = samples.get(name)
    return None if values is None else sum(v for _, v in values)


def _cache_int(samples: dict[str, list[tuple[dict[str, str], float]]], label: str) -> int | None:
    for labels, _ in samples.get(CACHE_INFO, []):
        if labels.get(label, "").isdigit():
            return int(labels[label])
    return None


@dataclass
class MetricsSampler:
    """Reads a vLLM server's /metrics while loaded calls run (`begin` / `end` around each call)."""

    http: httpx.Client
    root: str
    interval_s: float = SAMPLE_INTERVAL_S
    running: dict[int, int] = field(default_factory=dict)  # num_requests_running -> readings
    max_waiting: int = 0
    usage: list[float] = field(default_factory=list)
    preemptions: int = 0
    kv_cache_blocks: int | None = None
    block_size: int | None = None
    problem: str | None = None  # why the server's counters could not be read (None: they could)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _preempted_at: float | None = None

    @classmethod
    def at(cls, base_url: str, headers: Mapping[str, str]) -> MetricsSampler:
        """A sampler of the server at `base_url` every SAMPLE_INTERVAL_S (its own connection, the client's
        `headers`)."""
        http = httpx.Client(headers=dict(headers), timeout=METRICS_TIMEOUT_S, trust_env=False, follow_redirects=False)
        return cls(http=http, root=server_root(base_url), interval_s=SAMPLE_INTERVAL_S)

    @property
    def samples(self) -> int:
        """Readings of the gauges so far."""
        return sum(self.running.values())

    def _read(self) -> dict[str, list[tuple[dict[str, str], float]]] | None:
        if self.problem is not None:
            return None
        try:
            resp = self.http.get(f"{self.root}/metrics")
        except httpx.HTTPError as exc:
            self.problem = f"GET {self.root}/metrics failed ({type(exc).__name__})"
            return None
        if resp.status_code != 200:
            self.problem = f"GET {self.root}/metrics answered HTTP {resp.status_code}"
            return None
        samples = metric_samples(resp.text)
        if RUNNING not in samples or PREEMPTIONS not in samples:
            self.problem = "the server's /metrics has no scheduler gauges (started with disable_log_stats?)"
            return None
        return samples

    def _sample(self) -> None:
        """One reading of the gauges."""
        samples = self._read()
        if samples is None:
            return
        running = int(_total(samples, RUNNING) or 0)
        self.running[running] = self.running.get(running, 0) + 1
        self.max_waiting = max(self.max_waiting, int(_total(samples, WAITING) or 0))
        usages = [v for _, v in samples.get(USAGE, [])]
        if usages:
            self.usage.append(max(usages))

    def _preemption_count(self) -> float | None:
        """The preemption counter (and, at the first reading, the cache's size)."""
        samples = self._read()
        if samples is None:
            return None
        if self.kv_cache_blocks is None:
            self.kv_cache_blocks = _cache_int(samples, "num_gpu_blocks")
            self.block_size = _cache_int(samples, "block_size")
        return _total(samples, PREEMPTIONS)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def begin(self) -> None:
        """A loaded call starts: read the preemption counter and start reading the gauges."""
        self._preempted_at = self._preemption_count()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="openai-load-metrics", daemon=True)
        self._thread.start()

    def end(self) -> None:
        """The call ended: stop reading the gauges and add the call's preemptions."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        after = self._preemption_count()
        if after is not None and self._preempted_at is not None:
            self.preemptions += int(after - self._preempted_at)

    def close(self) -> None:
        """Close the connection."""
        self.http.close()
