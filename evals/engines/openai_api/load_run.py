"""Serving one `openai` engine call's requests under a LoadSpec (evals.engines.openai_api.load).

The server schedules and batches; only arrival is driven here, by request slots. While any evaluated request
of the call is queued or in flight the client holds `concurrency` slots: the evaluated requests take at most
`evaluated_slots` of them (the engine's worker pool has that many threads, each going straight on to the next
item), filler requests the others (`concurrency - min(evaluated_slots, evaluated left)`, set out at the call's
start, so the first evaluated request arrives amid them; a slot an evaluated request frees at the call's tail
goes to a filler). A filler slot sends filler after filler
(`filler_max_tokens` greedy tokens, EOS ignored where the server honours it) until no evaluated request is
left; fillers are never cut short (an aborted request's tokens would be missing from a counted server's
proof of execution, evals.engines.vllm.kv.server_counts, which counts fillers too: their responses are noted
by the engine's watch and their failed attempts added to its count), so the call ends when the last filler
answers. A filler that fails refuses the call (EngineError): its evaluated requests did not run under the load
asked for.

What ran: the client's requests in flight (an evaluated one from just before it is sent, a filler from when its
slot sets it out, each until its answer is read) beside each evaluated request, averaged over its time in flight, and for a vLLM server its /metrics (evals.engines.openai_api.load_metrics).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from evals import data
from evals.data.files import resolve_data_dir
from evals.engines.base import Failure
from evals.engines.load import LoadSpec
from evals.engines.openai_api.args import OpenAIArgs
from evals.engines.openai_api.client import ApiClient, RequestRejected, RetriesExhausted
from evals.engines.openai_api.load import (
    IGNORE_EOS_KINDS,
    FillerPrompt,
    ServedLoadRecord,
    filler_body,
    filler_path,
    filler_prompts,
    record_fields,
)
from evals.engines.openai_api.load_metrics import MetricsSampler
from evals.engines.vllm.load_run import WIKITEXT_CHARS
from evals.errors import EngineError

T = TypeVar("T")
R = TypeVar("R")
FILLER_KEYS = 1 << 40  # request numbers of fillers (they seed only the retries' jitter)


def wikitext_text() -> str:
    """The first WIKITEXT_CHARS of WikiText-2's test text (the filler source "wikitext2")."""
    rows = data.load("wikitext2", resolve_data_dir(None))
    return "".join(str(r["text"]) for r in rows)[:WIKITEXT_CHARS]


@dataclass
class _Call:
    """One engine call's slots (changed under ServedLoad's lock)."""

    queued: int  # evaluated requests not yet sent
    pool: list[FillerPrompt]
    running: int = 0  # evaluated requests in flight
    fillers: int = 0  # filler slots held
    turn: int = 0
    stopping: bool = False
    error: str | None = None

    def wants_fillers(self) -> bool:
        return bool(self.pool) and not self.stopping and self.error is None and self.queued + self.running > 0


@dataclass
class _Flight:
    """Requests in flight and their integral over time (under ServedLoad's lock)."""

    count: int = 0
    area: float = 0.0
    at: float = 0.0

    def change(self, delta: int) -> tuple[float, float]:
        """Add `delta` requests now; (time, integral) at this moment."""
        now = time.monotonic()
        self.area += self.count * (now - self.at)  # nothing before the first request (count 0)
        self.at = now
        self.count += delta
        return now, self.area


class ServedLoad:
    """Sends an `openai` engine's calls under one LoadSpec and keeps what ran (`record`)."""

    def __init__(self, spec: LoadSpec, args: OpenAIArgs, *, served_model: str, kind: str, api_key: str | None,
                 note: Callable[[Mapping[str, Any]], object], encode: Callable[[str], list[int]],
                 sampler: MetricsSampler | None) -> None:
        self.spec = spec
        self.kind = kind
        self.served_model = served_model
        self.sampler = sampler
        self._note = note  # the engine's watch of a counted server: every response, fillers' too
        self._encode = encode
        self._client = ApiClient(args.model_copy(update={"concurrency": spec.concurrency}), api_key=api_key)
        self._workers = ThreadPoolExecutor(max_workers=spec.concurrency, thread_name_prefix="openai-filler")
        self._cv = threading.Condition()
        self._flight = _Flight()
        self._rng = random.Random(spec.seed)
        self._keys = itertools.count(FILLER_KEYS)
        self._wikitext: str | None = None
        self._wikitext_ids: list[int] | None = None
        self.evaluated = 0
        self.fillers = 0
        self.companions: list[float] = []  # per evaluated request: others in flight, averaged over its flight

    @property
    def failed_attempts(self) -> int:
        """Filler attempts that failed transiently (the server may have computed tokens no answer shows)."""
        return self._client.failed_attempts

    def _pool(self, prompts: Sequence[FillerPrompt]) -> list[FillerPrompt]:
        if self.spec.filler == "wikitext2":
            if self._wikitext is None:
                self._wikitext = wikitext_text()
            if self._wikitext_ids is None and any(isinstance(p, list) and p and isinstance(p[0], int)
                                                  for p in prompts):
                self._wikitext_ids = self._encode(self._wikitext)
        return filler_prompts(prompts, self.spec.filler, self._rng, wikitext_text=self._wikitext or "",
                              wikitext_ids=self._wikitext_ids or [])

    def _claim(self, call: _Call) -> tuple[FillerPrompt, int] | None:
        """The next filler of a slot (its prompt and request number), counted in flight from now; None when
        the call has no evaluated request left (under the lock)."""
        if not call.wants_fillers():
            return None
        prompt = call.pool[call.turn % len(call.pool)]
        call.turn += 1
        self.fillers += 1
        self._flight.change(+1)
        return prompt, next(self._keys)

    def _top_up(self, call: _Call) -> None:
        """Hold a filler in every slot the evaluated requests leave (under the lock)."""
        want = self.spec.concurrency - min(self.spec.slots, call.queued + call.running)
        while call.fillers < want and (job := self._claim(call)) is not None:
            call.fillers += 1
            self._workers.submit(self._filler_slot, call, job)

    def _filler_slot(self, call: _Call, job: tuple[FillerPrompt, int] | None) -> None:
        """One filler slot: filler after filler while the call has evaluated requests left; the slot passes
        from one filler to the next under the lock, so it never stands empty in between."""
        while job is not None:
            prompt, key = job
            body = filler_body(prompt, self.spec.filler_max_tokens, self.kind)
            error = None
            try:
                answer = self._client.request("POST", filler_path(prompt), key, {"model": self.served_model, **body})
                if isinstance(answer, Mapping):
                    self._note(answer)
            except (RequestRejected, RetriesExhausted) as exc:
                error = str(exc)
            except BaseException as exc:  # noqa: BLE001 - any filler failure ends the load, said in one line
                error = f"{type(exc).__name__}: {exc}"
            with self._cv:
                call.error = call.error or error
                self._flight.change(-1)
                job = self._claim(call)
                if job is None:
                    call.fillers -= 1
                    self._cv.notify_all()

    def map(self, client: ApiClient, fn: Callable[[T, int], R], items: Sequence[T],
            prompts: Sequence[FillerPrompt]) -> list[R | Failure]:
        """client.map(fn, items) under the load, with fillers drawn from `prompts` (the call's own)."""
        if not items:
            return client.map(fn, items)
        call = _Call(queued=len(items), pool=self._pool(prompts))

        def evaluated(item: T, key: int) -> R:
            with self._cv:
                call.queued -= 1
                call.running += 1
                t0, a0 = self._flight.change(+1)
            try:
                return fn(item, key)
            finally:
                with self._cv:
                    t1, a1 = self._flight.change(-1)
                    # the integral counts this request over its own flight: the rest are its companions
                    self.companions.append((a1 - a0) / (t1 - t0) - 1 if t1 > t0 else float(self._flight.count))
                    call.running -= 1
                    self._top_up(call)

        if self.sampler is not None:
            self.sampler.begin()
        try:
            with self._cv:
                self._top_up(call)  # the fillers set out first: the first evaluated request arrives amid them
            results = client.map(evaluated, items)
        finally:
            with self._cv:
                call.stopping = True  # no new filler; those in flight run to their end
                self._cv.wait_for(lambda: call.fillers == 0)
            if self.sampler is not None:
                self.sampler.end()
        self.evaluated += len(items)
        if call.error is not None:
            raise EngineError(f"load: a filler request failed ({call.error}); the evaluated requests did not run "
                              "under the load asked for (a length the server refuses: lower filler_max_tokens)")
        return results

    def record(self) -> ServedLoadRecord:
        """What ran: the client's count and, for a vLLM server, its /metrics over the loaded calls."""
        unrecorded: list[str] = []
        ignore_eos = self.kind in IGNORE_EOS_KINDS
        if not ignore_eos:
            unrecorded.append(f"a {self.kind!r} server is not known to honour ignore_eos: a filler may stop at EOS")
        s = self.sampler
        server: dict[str, object] = dict.fromkeys(
            ("running_samples", "max_running", "mean_running", "max_waiting", "preemptions", "kv_cache_usage_max",
             "kv_cache_usage_mean", "kv_cache_blocks", "block_size"))
        if s is None:
            unrecorded.append(f"the server's own counters: a {self.kind!r} server's /metrics is not read (vLLM's "
                              "names only); the companions are the client's count")
        else:
            if s.problem is not None:
                unrecorded.append(f"the server's own counters: {s.problem}")
            if s.samples:
                server.update(
                    running_samples={str(n): k for n, k in sorted(s.running.items())}, max_running=max(s.running),
                    mean_running=round(sum(n * k for n, k in s.running.items()) / s.samples, 3),
                    max_waiting=s.max_waiting, preemptions=s.preemptions if s.problem is None else None,
                    kv_cache_usage_max=round(max(s.usage), 4) if s.usage else None,
                    kv_cache_usage_mean=round(sum(s.usage) / len(s.usage), 4) if s.usage else None,
                    kv_cache_blocks=s.kv_cache_blocks, block_size=s.block_size)
        return ServedLoadRecord(
            **record_fields(self.spec), server=self.kind, filler_ignore_eos=ignore_eos,  # type: ignore[arg-type]
            evaluated_requests=self.evaluated, filler_requests=self.fillers,
            companions_min=round(min(self.companions, default=0.0), 3),
            companions_mean=round(sum(self.companions) / max(len(self.companions), 1), 3),
            sample_interval_s=s.interval_s if s is not None else 0.0, samples=s.samples if s is not None else 0,
            unrecorded=unrecorded, **server)  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop the filler threads and close the connections."""
        self._workers.shutdown(wait=True)
        self._client.close()
        if self.sampler is not None:
            self.sampler.close()
