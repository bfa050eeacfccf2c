"""The `load` option (vllm and served arms): every evaluated request served amid others, as on a busy server.

`engine_args.load = { concurrency = N, filler = "task" | "wikitext2", filler_max_tokens = M,
evaluated_slots = K, kv_cache_blocks = B }` keeps N requests in vLLM at every step while any evaluated one
runs: at most K evaluated requests at once (default N, so the task's own items fill the batch), the
other slots filled by filler requests (prompts of the same call's own lengths from the task's prompts
or WikiText-2, decoding M tokens each with EOS ignored), so new prefills are chunked in amid decodes.
Concurrency 1 serves the evaluated requests one at a time with nothing beside them: the reference
level. `kv_cache_blocks` bounds vLLM's KV cache (its own `num_gpu_blocks_override`) so that requests are
preempted and recomputed, their K/V passing through the format again. The batching is vLLM's own
scheduler; only the arrival of requests is driven here (evals.engines.vllm.load_run).

What ran is a LoadRecord in the arm's arm.json (engine_info.load): vLLM's scheduler counters per step
(requests running and waiting, KV cache usage, preemptions) and the number of other requests in flight
beside each evaluated one. Pydantic only: no vllm, no torch at import time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from quant.validation import did_you_mean

FillerSource = Literal["task", "wikitext2"]
BLOCKS_FLAG = "num_gpu_blocks_override"  # vLLM's CacheConfig field that `kv_cache_blocks` sets


class LoadSpec(BaseModel):
    """How an arm's requests are served: concurrency, filler and an optional bound on the KV cache."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int = Field(ge=1, le=4096)  # requests in vLLM at every step while an evaluated one runs
    filler: FillerSource = "task"  # where filler prompts come from
    filler_max_tokens: int = Field(default=64, ge=1)  # tokens each filler decodes (EOS ignored)
    evaluated_slots: int | None = Field(default=None, ge=1)  # most evaluated requests in flight (None: concurrency)
    kv_cache_blocks: int | None = Field(default=None, ge=1)  # vLLM's num_gpu_blocks_override: forces preemption
    seed: int = 0  # the fillers' order

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: object) -> object:
        # an unknown key is named before any missing one (a misspelt `concurrency` is both)
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    raise ValueError(f"unknown key {key!r}; " + did_you_mean(str(key), list(cls.model_fields),
                                                                             listing="keys are"))
        return data

    @model_validator(mode="after")
    def _slots_fit(self) -> LoadSpec:
        if self.evaluated_slots is not None and self.evaluated_slots > self.concurrency:
            raise ValueError(f"evaluated_slots = {self.evaluated_slots} exceeds concurrency = {self.concurrency}")
        return self

    @property
    def slots(self) -> int:
        """Most evaluated requests in flight at once."""
        return self.concurrency if self.evaluated_slots is None else self.evaluated_slots

    def engine_flags(self) -> dict[str, int]:
        """The vLLM EngineArgs flags this option sets (the KV-cache bound)."""
        return {} if self.kv_cache_blocks is None else {BLOCKS_FLAG: self.kv_cache_blocks}


def load_key_message(where: str, msg: str) -> str:
    """One line for a bad value of a `load` key (`where`: the key path below `load`)."""
    return f"load.{where}: {msg}"


def flag_conflict(load: LoadSpec, flags: Mapping[str, object]) -> str | None:
    """Why `load` cannot go with the arm's vLLM flags (None: it can)."""
    if load.kv_cache_blocks is not None and BLOCKS_FLAG in flags:
        return f"load.kv_cache_blocks and {BLOCKS_FLAG} both bound the KV cache; keep one"
    if flags.get("disable_log_stats") is True:
        return "load needs vLLM's scheduler counters: remove disable_log_stats = true"
    return None


class LoadRecord(BaseModel):
    """What a loaded arm ran, from vLLM's own scheduler counters (not fingerprinted)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int
    filler: FillerSource
    filler_max_tokens: int
    evaluated_slots: int
    kv_cache_blocks: int | None  # vLLM's resolved KV-cache size in blocks (cache_config.num_gpu_blocks)
    block_size: int | None  # tokens per KV-cache block
    evaluated_requests: int
    filler_requests: int
    steps: int  # engine steps with a scheduler report
    running_steps: dict[str, int]  # vLLM's num_running_reqs after a step -> number of such steps
    max_running: int
    mean_running: float
    max_waiting: int  # vLLM's num_waiting_reqs, most over the steps
    preemptions: int  # vLLM's IterationStats.num_preempted_reqs, summed
    kv_cache_usage_max: float  # vLLM's SchedulerStats.kv_cache_usage (fraction of blocks in use)
    kv_cache_usage_mean: float
    # requests in flight beside an evaluated one (submitted, not finished), over its steps: fewest and mean
    companions_min: int
    companions_mean: float
    source: str = "vLLM SchedulerStats + IterationStats (a stat logger on the engine)"
