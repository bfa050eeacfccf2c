"""Switching the plugin on for one offline vLLM engine: the environment set while vLLM starts (its own
processes inherit it), the hook installed in this process (vLLM loads plugins once per process, so an
engine built after one without the plugin still needs it), and the records read back once vLLM is up:
one per process that loads the model (its tensor / pipeline / data-parallel ranks), all recording the same
load, else the arm is refused rather than run wholly or partly unemulated (record.checked_record)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from evals.engines.vllm_kv.plugin import register
from evals.engines.vllm_kv.record import PluginRecord, checked_record, expected_loads, read_records
from evals.engines.vllm_kv.spec import PLUGIN_ENV, plugin_env
from quant.kv_spec import KVQuantSpec


@contextmanager
def scoped_env(env: Mapping[str, str]) -> Iterator[None]:
    """Set `env` in this process for the duration of the block, then restore what was there."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def plugin_on(spec: KVQuantSpec) -> Iterator[Path]:
    """Within the block the plugin rewrites K/V as `spec` says in every model vLLM loads (this process and
    the ones it starts); yields the folder the loads are recorded in (removed after the block)."""
    with tempfile.TemporaryDirectory(prefix="qa-kv-") as tmp, scoped_env(plugin_env(spec, Path(tmp))):
        register()
        yield Path(tmp)


@contextmanager
def plugin_off() -> Iterator[None]:
    """Within the block `QA_VLLM_KV` is unset: an arm without a kv table runs unemulated, and unchecked by
    nothing, even when the environment `qa run` started in sets it (restored after the block)."""
    saved = os.environ.pop(PLUGIN_ENV, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[PLUGIN_ENV] = saved


def loaded_record(folder: Path, flags: Mapping[str, object] | None = None) -> PluginRecord:
    """The record of the model vLLM loaded under `plugin_on`, checked against the processes that load it:
    `flags` are the `vllm.LLM` keywords (their parallel sizes; None: one process, a plain single-rank
    engine); EngineError when fewer records were written or they disagree (record.checked_record)."""
    return checked_record(read_records(folder), expected_loads(flags or {}), where="vllm")
