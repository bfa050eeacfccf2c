"""The hub fallback is offline by default and says how to get the data when it is not cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals import data
from evals.data import hub
from evals.errors import DataError


def test_hub_fallback_is_offline_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    assert hub.hub_offline()
    with pytest.raises(DataError) as exc:
        data.load("math500", None)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "HuggingFaceH4/MATH-500" in msg and "--data-dir" in msg and "HF_DATASETS_OFFLINE=0" in msg
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    assert not hub.hub_offline()
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.setenv("HF_HUB_OFFLINE", "off")
    assert not hub.hub_offline()
