"""Switching the plugin on for one offline vLLM engine: the environment set while vLLM starts (its own
processes inherit it), the hook installed in this process (vLLM loads plugins once per process, so an
engine built after one without the plugin still needs it), and the records read back once vLLM is up:
one per process that loads the model (its tensor / pipeline / data-parallel ranks), all recording the same
load, else the arm is refused rather than run wholly or partly unemulated (record.checked_record); and,
after the arm, every layer's device counts read from the workers and checked against the tokens vLLM
computed (`ExecutionWatch`, evals.engines.vllm.kv.proof)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.engines.vllm.kv.plugin import register
from evals.engines.vllm.kv.proof import TokenTally, checked_execution, counted_since, parse_counts
from evals.engines.vllm.kv.record import (
    COUNTS_METHOD,
    KVExecution,
    LoadCounts,
    PluginRecord,
    checked_record,
    expected_loads,
    read_records,
)
from evals.engines.vllm.kv.spec import PLUGIN_ENV, RAY_COPY_ENV, plugin_env
from evals.offline import scoped_env
from quant.kv.spec import KVQuantSpec


@contextmanager
def plugin_on(spec: KVQuantSpec) -> Iterator[Path]:
    """Within the block the plugin rewrites K/V as `spec` says in every model vLLM loads (this process and
    the ones it starts); yields the folder the loads are recorded in (removed after the block)."""
    with tempfile.TemporaryDirectory(prefix="qa-kv-") as tmp, scoped_env(plugin_env(spec, Path(tmp), ray_extra=os.environ.get(RAY_COPY_ENV, ""))):
        register()
        yield Path(tmp)


def plugin_off() -> AbstractContextManager[None]:
    """Within the block `QA_VLLM_KV` is unset: an arm without a kv table runs unemulated even when the
    environment `qa run` started in sets it (restored after the block)."""
    return scoped_env({PLUGIN_ENV: None})


def loaded_record(folder: Path, flags: Mapping[str, object] | None = None) -> PluginRecord:
    """The record of the model vLLM loaded under `plugin_on`, checked against the processes that load it:
    `flags` are the `vllm.LLM` keywords (their parallel sizes; None: one process, a plain single-rank
    engine); EngineError when fewer records were written or they disagree (record.checked_record)."""
    return checked_record(read_records(folder), expected_loads(flags or {}), where="vllm")


def read_counts(llm: Any) -> list[LoadCounts]:
    """Every worker's per-layer counters (plugin.load_counts through vLLM's `LLM.collective_rpc`, which runs
    a worker method by name in the engine core's workers, in or out of process)."""
    return parse_counts(llm.collective_rpc(COUNTS_METHOD))


def preemptions(llm: Any) -> int | None:
    """vLLM's cumulative preemption counter (None: the engine keeps no stats)."""
    if not llm.llm_engine.log_stats:
        return None
    return sum(int(getattr(m, "value", 0)) for m in llm.get_metrics() if m.name == "vllm:num_preemptions")


@dataclass
class ExecutionWatch:
    """The counts at the start of an arm and the tokens its requests made vLLM compute, checked at its end."""

    llm: Any
    before: list[LoadCounts]
    preempted: int | None
    async_scheduling: bool
    dp_ranks: int
    tally: TokenTally = field(default_factory=TokenTally)

    @classmethod
    def start(cls, llm: Any) -> ExecutionWatch:
        """Start watching a freshly built engine (its warm-up writes are left out)."""
        config = llm.llm_engine.vllm_config
        return cls(llm=llm, before=read_counts(llm), preempted=preemptions(llm),
                   async_scheduling=bool(getattr(config.scheduler_config, "async_scheduling", False)),
                   dp_ranks=int(getattr(config.parallel_config, "data_parallel_size", 1) or 1))

    def add(self, outputs: Iterable[Any]) -> None:
        """Count one generate call's RequestOutputs."""
        self.tally.add_all(outputs, async_scheduling=self.async_scheduling)

    def failed(self) -> None:
        """A generate call raised: the tokens it computed are not in any output."""
        self.tally.not_exact("a batch failed")

    def finish(self) -> KVExecution:
        """Every layer's counts since `start`, checked (`refusal` set when they do not match)."""
        after = read_counts(self.llm)
        now = preemptions(self.llm)
        if now is None:
            self.tally.not_exact("preemptions not known (disable_log_stats)")
        elif self.preempted is not None and now > self.preempted:
            self.tally.preempted(now - self.preempted)
        if self.llm.llm_engine.vllm_config.speculative_config is not None:
            self.tally.speculative()
        return checked_execution(counted_since(self.before, after), self.tally, dp_ranks=self.dp_ranks)
