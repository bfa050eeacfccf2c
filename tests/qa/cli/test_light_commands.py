"""`qa gate`, `qa report`, `qa compare` and `qa plan` never import torch (nor transformers, vLLM, datasets,
lm-eval): each runs in a fresh interpreter on real folders and reports what it had loaded. Drawing a
report's plots loads matplotlib, and only then."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evals.records.samples import SampleRecord, sha256_text, write_records

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "reports" / "engines" / "vllm_bf16_vs_fp8"
HEAVY = ("torch", "transformers", "vllm", "datasets", "lm_eval", "statsmodels")
PROBE = """
import json, sys
from qa.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "loaded": [m for m in HEAVY if m in sys.modules],
                  "matplotlib": "matplotlib" in sys.modules}))
""".replace("HEAVY", repr(HEAVY))


def _arm(folder: Path, arm: str) -> Path:
    recs = [SampleRecord(task="arc_easy", task_version="1", arm=arm, item_id=str(i),
                         prompt_hash=sha256_text(f"Question {i}"), scores={"acc,none": float(i % 3 != 0)})
            for i in range(60)]
    write_records(folder / "arc_easy.jsonl", recs)
    return folder


def _probe(*argv: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=False, env={**os.environ, "COLUMNS": "200"})
    assert out.stdout.strip(), out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_gate_report_compare_and_plan_load_no_torch(tmp_path: Path) -> None:
    if not (COMMITTED / "comparison.json").is_file():
        pytest.skip("the committed vllm_bf16_vs_fp8 report is missing")
    run = tmp_path / "run"
    shutil.copytree(COMMITTED, run)
    gate = _probe("gate", str(run))
    assert gate["code"] in (0, 1, 3) and gate["loaded"] == [] and not gate["matplotlib"]
    report = _probe("report", str(run))
    assert report["code"] in (None, 0) and report["loaded"] == [] and report["matplotlib"]  # it drew plots
    compare = _probe("compare", str(_arm(tmp_path / "b", "baseline")), str(_arm(tmp_path / "c", "candidate")),
                     "--out", str(tmp_path / "cmp"), "--bootstrap", "0")
    assert compare["code"] in (None, 0) and compare["loaded"] == []
    plan = _probe("plan", "--task", "gsm8k", "--margin", "0.02")
    assert plan["code"] in (None, 0) and plan["loaded"] == []
