"""Offline by default: the one reading of HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, and the environment every
child process and server of a run starts from.

A run never downloads unless asked. It is asked when HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set to a
false value as huggingface_hub spells them (0, false, no, off; any case, spaces ignored); unset, a true
value or anything else is offline. Either switch asks for datasets and models alike: a child's
environment holds both (OFFLINE_DEFAULTS fill in the one left unset), so `HF_HUB_OFFLINE=0` alone must
not be vetoed by the other's default "1". Where the hub is used, `hub_mode` sets huggingface_hub (and
datasets) to this answer, whatever each read from the environment at import.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")  # the switches; env.json records both
FALSE_VALUES = frozenset({"0", "false", "no", "off"})  # huggingface_hub's spellings of "not offline"
# What every child process and server gets unless the environment or the arm sets it: no downloads
# (model files come from the resolved folder, data from the data dir or the local HF cache), no telemetry.
OFFLINE_DEFAULTS: Mapping[str, str] = MappingProxyType({
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
})


def hub_offline(env: Mapping[str, str] | None = None) -> bool:
    """False only when HF_HUB_OFFLINE or HF_DATASETS_OFFLINE in `env` (default: os.environ) is a false
    value (0/false/no/off, any case); the answer for datasets and models alike."""
    env = os.environ if env is None else env
    return not any(env.get(var, "").strip().lower() in FALSE_VALUES for var in OFFLINE_VARS)


def offline_env(base: Mapping[str, str] | None = None,
                extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A child's environment: OFFLINE_DEFAULTS, overridden by `base` (default: os.environ), overridden by
    `extra` (an arm's or a server's own variables)."""
    return {**OFFLINE_DEFAULTS, **(os.environ if base is None else base), **(extra or {})}


@contextmanager
def hub_mode(offline: bool) -> Iterator[None]:
    """huggingface_hub (and datasets, when imported) offline or not as `offline` says, for the block; both
    read the variables once at import, each its own way, so they are set here from the one answer."""
    import huggingface_hub.constants as hub  # huggingface_hub: only where a model or dataset is looked up

    config = sys.modules.get("datasets.config")  # not imported for it: a model lookup needs no datasets
    saved = hub.HF_HUB_OFFLINE, getattr(config, "HF_HUB_OFFLINE", None)
    hub.HF_HUB_OFFLINE = offline
    if config is not None:
        config.HF_HUB_OFFLINE = offline
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE = saved[0]
        if config is not None:
            config.HF_HUB_OFFLINE = saved[1]


@contextmanager
def scoped_env(env: Mapping[str, str | None]) -> Iterator[None]:
    """`env` set in this process for the duration of the block (a None value unsets that variable), then
    what was there restored."""
    before = {k: os.environ.get(k) for k in env}
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
