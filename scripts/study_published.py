"""A published study folder, reports/<group>/<name>/: the run's spec, env, comparison, verdict and reports
(not its records), plus run.json (`RunInfo`: how `python -m scripts.fault_study` ran it; `qa run` writes no
run.json, this is the study's own note). The tables read it back
as `Published`: the comparison, and the verdict the gate gives it now under the recorded policy."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from qa.files.comparison import Comparison
from qa.files.rundir import RunDir
from qa.files.verdict import Status, Verdict
from qa.gate.decide import decide_folder
from quant.fileio import atomic_write_text

RUN_INFO = "run.json"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SeededCalibration(_Model):
    """Where the calibration of a run came from (another run directory) and its scales file's sha256."""

    run_dir: str
    sha256: str


class Refusal(_Model):
    """The nvfp4 candidate run once without the override: the engine's exit code and error line."""

    exit_code: int
    error: str | None
    seconds: float
    engine_args: dict[str, Any]


class RunInfo(_Model):
    """run.json: what the study did for one published run."""

    spec: str  # the spec, relative to the repository
    exit_code: int | None = None  # of `qa run`: 0 pass, 1 fail, 3 inconclusive, 2 an error
    wall_seconds: float | None = None
    error: str | None = None  # the run's `error:` lines, when it stopped
    preset: str | None = None  # the fault preset of quant/kv/faults.py (fault runs; None for a control)
    baseline_seeded_from: str | None = None
    calibration_seeded_from: SeededCalibration | None = None
    baseline_resumed_unchanged: bool | None = None  # the seeded records' sha256 did not change
    refusal: Refusal | None = None
    servers: dict[str, dict[str, Any]] | None = None  # per arm: the server settings `qa run` started
    kv_cache_log_lines: dict[str, str | None] | None = None  # per arm: llama.cpp's KV-cache size line
    llamacpp_server: dict[str, Any] | None = None  # older study runs: the llama.cpp servers it started itself


def publish(run_dir: Path, dest: Path, info: RunInfo) -> None:
    """Copy the run's reports (not its records) to `dest`, plus run.json with `info`."""
    src, out = RunDir(run_dir), RunDir(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for path in (src.spec_file, src.resolved, src.policy_file, src.env, src.comparison, src.verdict, src.report_md,
                 src.report_html, src.kv_inspect):
        if path.exists():
            shutil.copy2(path, dest / path.name)
    if src.plots.is_dir():
        shutil.rmtree(out.plots, ignore_errors=True)
        shutil.copytree(src.plots, out.plots)
    atomic_write_text(dest / RUN_INFO, info.model_dump_json(indent=2, exclude_none=True) + "\n")


@dataclass(frozen=True)
class Published:
    """One published run as the tables read it: numbers, the gate's verdict now, and run.json."""

    name: str
    comparison: Comparison
    verdict: Verdict  # decided now by the gate (qa.gate.decide) under the policy verdict.json records
    recorded_status: Status  # the status verdict.json records
    info: RunInfo | None


def load_published(folder: Path) -> Published | None:
    """The run published in `folder`, re-gated under its recorded policy; None when it has no verdict.json."""
    rd = RunDir(folder)
    if not rd.verdict.exists():
        return None
    recorded = rd.load_verdict()
    comparison = rd.load_comparison()
    verdict = decide_folder(rd, recorded.policy, comparison)
    info_path = folder / RUN_INFO
    info = RunInfo.model_validate_json(info_path.read_text(encoding="utf-8")) if info_path.exists() else None
    return Published(folder.name, comparison, verdict, recorded.status, info)
