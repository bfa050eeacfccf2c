"""Fixtures shared by the pipeline tests."""
from __future__ import annotations

from pathlib import Path

import pytest

import qa.pipeline.stages
from qa.files.resolved_json import ArmRecord


@pytest.fixture
def started_arms(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the arms whose worker process the pipeline starts, in order (the real worker still runs)."""
    started: list[str] = []
    real = qa.pipeline.stages.run_arm_process

    def spy(run_dir: Path, arm: ArmRecord) -> None:
        started.append(arm.name)
        real(run_dir, arm)

    monkeypatch.setattr(qa.pipeline.stages, "run_arm_process", spy)
    return started
