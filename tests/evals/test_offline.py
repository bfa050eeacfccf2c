"""evals.offline: one reading of HF_HUB_OFFLINE / HF_DATASETS_OFFLINE for datasets and models alike, and one
set of offline defaults that every child process and server starts from (the arm's own env winning)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evals import data
from evals.errors import DataError
from evals.models.resolve import resolve_model
from evals.offline import OFFLINE_DEFAULTS, OFFLINE_VARS, hub_offline, offline_env
from evals.servers.commands import server_env
from evals.servers.spec import LlamaCppServerSpec, VllmServerSpec

FALSE = ["0", "false", "no", "off", "OFF", "False", " No "]  # huggingface_hub's false spellings, any case
NOT_FALSE = ["1", "true", "YES", "on", "", "maybe"]  # a true value or anything else: offline


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in OFFLINE_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _model_lookup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[bool, bool]]:
    """Stand in for the hub: each model lookup records (local_files_only, huggingface_hub's offline switch)."""
    import huggingface_hub
    import huggingface_hub.constants as hub

    calls: list[tuple[bool, bool]] = []

    def snapshot_download(repo_id: str, *, local_files_only: bool) -> str:
        calls.append((local_files_only, hub.HF_HUB_OFFLINE))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def _dataset_lookup(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, bool]]:
    """Stand in for datasets.load_dataset: records (datasets' and huggingface_hub's offline switches), then fails."""
    import datasets
    import huggingface_hub.constants as hub

    calls: list[tuple[bool, bool]] = []

    def load_dataset(*args: Any, **kwargs: Any) -> None:
        calls.append((datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE))
        raise ConnectionError("no network in this test")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_unset_means_offline(unset: pytest.MonkeyPatch) -> None:
    assert hub_offline() and data.hub_offline() and hub_offline({})


@pytest.mark.parametrize("var", OFFLINE_VARS)
@pytest.mark.parametrize("value", FALSE)
def test_a_false_value_of_either_switch_means_online(var: str, value: str) -> None:
    assert not hub_offline({var: value})
    other = next(v for v in OFFLINE_VARS if v != var)
    assert not hub_offline({var: value, other: "1"})  # the other's default "1" in a child's env does not veto it


@pytest.mark.parametrize("value", NOT_FALSE)
def test_anything_but_a_false_value_means_offline(value: str) -> None:
    assert hub_offline({"HF_HUB_OFFLINE": value})
    assert hub_offline({"HF_HUB_OFFLINE": value, "HF_DATASETS_OFFLINE": value})


@pytest.mark.parametrize(("var", "value"), [("HF_HUB_OFFLINE", v) for v in FALSE[:5]] + [("HF_DATASETS_OFFLINE", "no")])
def test_datasets_and_models_go_online_alike(var: str, value: str, unset: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """HF_HUB_OFFLINE=no once made datasets go online while models stayed offline: now both follow one answer,
    and the hub libraries are switched to it for the call, whatever they read from the environment."""
    models, datasets_calls = _model_lookup(unset, tmp_path), _dataset_lookup(unset)
    unset.setenv("HF_HUB_OFFLINE" if var == "HF_DATASETS_OFFLINE" else "HF_DATASETS_OFFLINE", "1")
    unset.setenv(var, value)
    assert resolve_model("org/model").path == tmp_path
    with pytest.raises(DataError, match="could not be loaded \\(ConnectionError\\)"):  # online: not the offline hint
        data.load("math500", None)
    assert models == [(False, False)] and datasets_calls == [(False, False)]


def test_offline_datasets_and_models_read_the_local_cache_only(unset: pytest.MonkeyPatch, tmp_path: Path) -> None:
    models, datasets_calls = _model_lookup(unset, tmp_path), _dataset_lookup(unset)
    unset.setenv("HF_HUB_OFFLINE", "no-thanks")  # not a false value: offline
    resolve_model("org/model")
    with pytest.raises(DataError, match="not in the local HF cache \\(offline\\).*HF_DATASETS_OFFLINE=0"):
        data.load("math500", None)
    assert models == [(True, True)] and datasets_calls == [(True, True)]


def test_a_child_env_is_defaults_then_the_environment_then_its_own() -> None:
    env = offline_env({"HF_HUB_OFFLINE": "0", "PATH": "/bin"}, {"DO_NOT_TRACK": "0", "QA_X": "y"})
    assert env == {**OFFLINE_DEFAULTS, "HF_HUB_OFFLINE": "0", "PATH": "/bin", "DO_NOT_TRACK": "0", "QA_X": "y"}
    assert {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items() <= OFFLINE_DEFAULTS.items()
    assert offline_env({}) == dict(OFFLINE_DEFAULTS)


def test_the_defaults_reach_a_servers_env_and_the_arms_env_wins(unset: pytest.MonkeyPatch, tmp_path: Path) -> None:
    unset.setenv("DO_NOT_TRACK", "0")  # this process's environment beats a default
    unset.setenv("QA_TEST_SHELL", "kept")
    vllm = server_env(VllmServerSpec(model=tmp_path, env={"HF_DATASETS_OFFLINE": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}))
    assert vllm["HF_HUB_OFFLINE"] == "1" and vllm["VLLM_NO_USAGE_STATS"] == "1"  # defaults
    assert vllm["HF_DATASETS_OFFLINE"] == "0" and vllm["VLLM_CPU_KVCACHE_SPACE"] == "1"  # the arm's own
    assert vllm["DO_NOT_TRACK"] == "0" and vllm["QA_TEST_SHELL"] == "kept"
    unset.setenv("HF_HUB_OFFLINE", "0")
    llama = server_env(LlamaCppServerSpec(gguf=tmp_path / "m.gguf", rotate_kv=False, env={"HF_HUB_OFFLINE": "1"}))
    assert llama["HF_HUB_OFFLINE"] == "1" and llama["HF_DATASETS_OFFLINE"] == "1"  # the arm's env wins
    assert llama["LLAMA_ATTN_ROT_DISABLE"] == "1"
    assert hub_offline(llama) and not hub_offline(server_env(LlamaCppServerSpec(gguf=tmp_path / "m.gguf")))
