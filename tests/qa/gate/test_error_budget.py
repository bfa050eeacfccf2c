"""Engine faults end to end: records that carry errors beyond the policy's max_error_rate make the
gate inconclusive (exit 3), never pass, even when every scored pair agrees exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.records.samples import SampleRecord, sha256_text, write_records
from qa.cli import main

N_ITEMS = 400  # identical arms: a tight CI around 0, so only the error budget can stop a pass


def _arm(folder: Path, arm: str, failed: set[int]) -> None:
    recs = []
    for i in range(N_ITEMS):
        common = {"task": "arc_easy", "task_version": "1", "arm": arm, "item_id": str(i),
                  "prompt_hash": sha256_text(f"Question {i}")}
        if i in failed:
            recs.append(SampleRecord(**common, error="engine: HTTP 503 after 3 retries"))
        else:
            recs.append(SampleRecord(**common, scores={"acc,none": float(i % 3 != 0)}))
    write_records(folder / "arc_easy.jsonl", recs)


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out + err


@pytest.mark.parametrize("n_failed,status,rc", [(2, "pass", 0), (12, "inconclusive", 3)])
def test_errors_beyond_the_budget_gate_inconclusive_never_pass(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], n_failed: int, status: str, rc: int) -> None:
    # default policy: max_error_rate 0.01; 2 / 400 = 0.5% is inside it, 12 / 400 = 3% is not
    _arm(tmp_path / "base", "baseline", set())
    _arm(tmp_path / "cand", "candidate", set(range(0, 3 * n_failed, 3)))
    out = tmp_path / "run"
    code, text = _cli(["compare", str(tmp_path / "base"), str(tmp_path / "cand"), "--out", str(out),
                       "--bootstrap", "0"], capsys)
    assert code == 0, text
    code, text = _cli(["gate", str(out)], capsys)
    verdict = json.loads((out / "verdict.json").read_text())
    [task] = verdict["tasks"]
    assert (code, verdict["status"], task["status"]) == (rc, status, status), text
    if status == "inconclusive":
        assert task["kind"] == "errors" and "too many errored samples" in task["reason"]
        assert task["error_rate_candidate"] == pytest.approx(n_failed / N_ITEMS)
