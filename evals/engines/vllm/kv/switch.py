"""Switching the plugin on for one offline vLLM engine: the environment set while vLLM starts (its own
processes inherit it), the hook installed in this process (vLLM loads plugins once per process, so an
engine built after one without the plugin still needs it), and the records read back once vLLM is up:
one per process that loads the model (its tensor / pipeline / data-parallel ranks), all recording the same
load, else the arm is refused rather than run wholly or partly unemulated (record.checked_record)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from evals.engines.vllm.kv.plugin import register
from evals.engines.vllm.kv.record import PluginRecord, checked_record, expected_loads, read_records
from evals.engines.vllm.kv.spec import PLUGIN_ENV, plugin_env
from evals.offline import scoped_env
from quant.kv.spec import KVQuantSpec


@contextmanager
def plugin_on(spec: KVQuantSpec) -> Iterator[Path]:
    """Within the block the plugin rewrites K/V as `spec` says in every model vLLM loads (this process and
    the ones it starts); yields the folder the loads are recorded in (removed after the block)."""
    with tempfile.TemporaryDirectory(prefix="qa-kv-") as tmp, scoped_env(plugin_env(spec, Path(tmp))):
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
