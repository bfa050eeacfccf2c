"""`qa calibrate --export vllm --model-out` run for real in the main venv (vLLM's venv pins an older
transformers the calibration hooks do not support), for the vLLM tests that load the folder it writes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from evals.models.resolve import resolve_model
from quant.scales.files import KVScales
from tests.tiny_models import CORPUS

# where `qa calibrate` runs: $QA_MAIN_PYTHON (scripts/gpu_check.sh sets it), else the main venv
MAIN_PYTHON = Path(os.environ.get("QA_MAIN_PYTHON") or Path(__file__).resolve().parents[4] / ".venv" / "bin" / "python")


def calibrate_export(root: Path, fmt: str) -> tuple[KVScales, Path]:
    """SmolLM2-135M-Instruct's `fmt` KV scales (absmax, 2 x 64 tokens) and the model folder carrying them,
    under `root`; skips the test when the model or the main venv is missing."""
    try:
        resolve_model("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 - no model here means nothing to test against
        pytest.skip(f"smollm2-135m is not available: {exc}")
    if not MAIN_PYTHON.is_file():
        pytest.skip(f"{MAIN_PYTHON} (the main venv, scripts/setup.sh) is missing")
    text = root / "calib.txt"
    text.write_text(CORPUS * 20, encoding="utf-8")
    cmd = [str(MAIN_PYTHON), "-m", "qa.cli.main", "calibrate", "--model", "smollm2-135m", "--data", str(text),
           "--format", fmt, "--observer", "absmax", "--n-samples", "2", "--seq-len", "64",
           "--out", str(root / "scales"), "--export", "vllm", "--model-out", str(root / "model")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return KVScales.load(root / "scales"), root / "model"
