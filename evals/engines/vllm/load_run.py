"""Serving one engine call's requests under a LoadSpec on vLLM's offline engine (evals.engines.load).

The requests go to vLLM's own `LLMEngine` (add_request / step): vLLM schedules them, chunks prefills and
batches decodes; this module only decides when each request arrives. Before every step the engine holds
`concurrency` requests while any evaluated one is queued or running: evaluated ones first (at most
`evaluated_slots` of them), filler requests in the other slots. Fillers decode `filler_max_tokens` tokens
with EOS ignored and are never cut short (an aborted request's computed tokens would be missing from the
outputs the qa_kv plugin's proof counts): the call ends when every request it added has finished. An
evaluated request's outputs depend on the fillers only through the batch it is computed in.

vLLM's scheduler counters are read by a stat logger added to the engine's StatLoggerManager (vLLM calls it
with every step's SchedulerStats and IterationStats); it counts only while a loaded call runs.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from evals import data
from evals.data.files import resolve_data_dir
from evals.engines.load import LoadRecord, LoadSpec
from evals.errors import EngineError

WIKITEXT_CHARS = 400_000  # of WikiText-2's test text tokenised for filler windows (~90K tokens: plenty)
_IDS = itertools.count()


@dataclass
class SchedulerTally:
    """vLLM's per-step scheduler counters, summed (a stat logger: vLLM calls `record` every step)."""

    active: bool = False
    steps: int = 0
    running: dict[int, int] = field(default_factory=dict)
    max_waiting: int = 0
    preemptions: int = 0
    usage_sum: float = 0.0
    usage_max: float = 0.0

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        """One step's SchedulerStats (requests running / waiting, KV cache usage) and IterationStats."""
        if not self.active:
            return
        if iteration_stats is not None:
            self.preemptions += int(iteration_stats.num_preempted_reqs)
        if scheduler_stats is None:
            return
        self.steps += 1
        n = int(scheduler_stats.num_running_reqs)
        self.running[n] = self.running.get(n, 0) + 1
        self.max_waiting = max(self.max_waiting, int(scheduler_stats.num_waiting_reqs))
        usage = float(scheduler_stats.kv_cache_usage)
        self.usage_sum += usage
        self.usage_max = max(self.usage_max, usage)

    def log(self) -> None:
        """vLLM's periodic log call: nothing to print."""

    def log_engine_initialized(self) -> None:
        """vLLM's start-up call: nothing to print."""

    def record_sleep_state(self, is_awake: int = 0, level: int = 0) -> None:
        """vLLM's sleep-mode call: nothing to count."""


def attach_tally(llm: Any) -> SchedulerTally:
    """A SchedulerTally added to the engine's stat loggers; EngineError when vLLM keeps no stats."""
    manager = getattr(llm.llm_engine, "logger_manager", None)
    if manager is None:
        raise EngineError("load: vLLM keeps no scheduler stats (disable_log_stats); remove disable_log_stats = true")
    tally = SchedulerTally()
    manager.stat_loggers.append(tally)
    return tally


def wikitext_ids(encode: Callable[[str], list[int]]) -> list[int]:
    """The first WIKITEXT_CHARS of WikiText-2's test text as token ids (the filler source "wikitext2")."""
    rows = data.load("wikitext2", resolve_data_dir(None))
    text = "".join(str(r["text"]) for r in rows)[:WIKITEXT_CHARS]
    return encode(text)


@dataclass
class LoadedCall:
    """One call's outputs: the evaluated requests' in their order, and the fillers' (for the plugin's proof)."""

    evaluated: list[Any]
    filler: list[Any]


@dataclass
class LoadRunner:
    """Serves engine calls under one LoadSpec and keeps what ran (`record`)."""

    spec: LoadSpec
    llm: Any
    sampling_params: Any  # vllm.SamplingParams
    max_model_len: int
    wikitext: list[int] | None = None  # token ids of the "wikitext2" filler source
    tally: SchedulerTally = field(default_factory=SchedulerTally)
    evaluated: int = 0
    fillers: int = 0
    companions: list[int] = field(default_factory=list)  # per evaluated request and step: others in flight
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if self.spec.filler_max_tokens >= self.max_model_len - 1:
            raise EngineError(f"load.filler_max_tokens = {self.spec.filler_max_tokens} leaves no room for a "
                              f"filler prompt in max_model_len = {self.max_model_len}")
        self._rng = random.Random(self.spec.seed)

    def _filler_prompts(self, prompts: Sequence[Any]) -> list[list[int]]:
        """Filler prompt ids for one call: the call's own prompts (rotated, so a filler is not the evaluated
        request beside it) or WikiText-2 windows of the call's prompt lengths; cut to fit with their decode."""
        room = self.max_model_len - self.spec.filler_max_tokens - 1
        ids = [list(p["prompt_token_ids"]) for p in prompts]
        if self.spec.filler == "task":
            half = len(ids) // 2
            pool = ids[half:] + ids[:half]
        else:
            text = self.wikitext or []
            pool = []
            for n in (len(i) for i in ids):
                n = max(1, min(n, room, len(text)))
                start = self._rng.randrange(0, max(1, len(text) - n))
                pool.append(text[start : start + n])
        return [p[-room:] for p in pool if p]

    def run(self, prompts: Sequence[Any], params: Sequence[Any]) -> LoadedCall:
        """Serve `prompts` (token-id prompts) with `params` under the load; outputs in request order."""
        engine = self.llm.llm_engine
        if engine.has_unfinished_requests():
            raise EngineError("load: vLLM still holds requests from an earlier call")
        pool = self._filler_prompts(prompts)
        filler_params = self.sampling_params(max_tokens=self.spec.filler_max_tokens, temperature=0.0,
                                             ignore_eos=True, detokenize=False)
        queue = deque(range(len(prompts)))
        inflight: dict[str, int] = {}  # request id -> evaluated index, or -1 for a filler
        done: dict[int, Any] = {}
        filler_outs: list[Any] = []
        turn = itertools.count()

        def add(prompt: Any, sp: Any, index: int) -> None:
            rid = f"qa-load-{next(_IDS)}"
            engine.add_request(rid, prompt, sp)
            inflight[rid] = index

        def top_up() -> None:
            n_eval = sum(i >= 0 for i in inflight.values())
            while queue and n_eval < self.spec.slots and len(inflight) < self.spec.concurrency:
                i = queue.popleft()
                add(prompts[i], params[i], i)
                n_eval += 1
            while (queue or n_eval) and pool and len(inflight) < self.spec.concurrency:
                add({"prompt_token_ids": pool[next(turn) % len(pool)]}, filler_params, -1)
                self.fillers += 1

        self.tally.active = True
        try:
            top_up()
            while inflight:
                n_eval = sum(i >= 0 for i in inflight.values())
                self.companions += [len(inflight) - 1] * n_eval
                for out in engine.step():
                    if out.finished and out.request_id in inflight:
                        index = inflight.pop(out.request_id)
                        if index >= 0:
                            done[index] = out
                        else:
                            filler_outs.append(out)
                if inflight and not engine.has_unfinished_requests():
                    raise EngineError(f"load: vLLM finished with {len(inflight)} request(s) never answered")
                top_up()
        except BaseException:
            if inflight:
                engine.abort_request(list(inflight), internal=False)
            raise
        finally:
            self.tally.active = False
        self.evaluated += len(prompts)
        return LoadedCall(evaluated=[done[i] for i in range(len(prompts))], filler=filler_outs)

    def record(self) -> LoadRecord:
        """What this runner served, with vLLM's scheduler counters and its resolved KV-cache size."""
        cache = self.llm.llm_engine.vllm_config.cache_config
        t = self.tally
        steps = max(t.steps, 1)
        mean_running = sum(n * k for n, k in t.running.items()) / steps
        return LoadRecord(
            concurrency=self.spec.concurrency, filler=self.spec.filler, filler_max_tokens=self.spec.filler_max_tokens,
            evaluated_slots=self.spec.slots, kv_cache_blocks=getattr(cache, "num_gpu_blocks", None),
            block_size=getattr(cache, "block_size", None), evaluated_requests=self.evaluated,
            filler_requests=self.fillers, steps=t.steps,
            running_steps={str(n): k for n, k in sorted(t.running.items())},
            max_running=max(t.running, default=0), mean_running=round(mean_running, 3), max_waiting=t.max_waiting,
            preemptions=t.preemptions, kv_cache_usage_max=round(t.usage_max, 4),
            kv_cache_usage_mean=round(t.usage_sum / steps, 4), companions_min=min(self.companions, default=0),
            companions_mean=round(sum(self.companions) / max(len(self.companions), 1), 3),
        )


def build_runner(spec: LoadSpec | None, llm: Any, sampling_params: Any,
                 encode: Callable[[str], list[int]]) -> LoadRunner | None:
    """A LoadRunner on a started `vllm.LLM` (its stat logger attached; WikiText-2 read when it is the filler);
    None without a spec (calls go to LLM.generate as they come)."""
    if spec is None:
        return None
    max_len = int(llm.llm_engine.model_config.max_model_len)
    wikitext = wikitext_ids(encode) if spec.filler == "wikitext2" else None
    runner = LoadRunner(spec=spec, llm=llm, sampling_params=sampling_params, max_model_len=max_len, wikitext=wikitext)
    runner.tally = attach_tally(llm)
    return runner
