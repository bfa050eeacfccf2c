"""Progress where there is no terminal: `qa run` with its output going to a pipe prints plain progress lines
(evals.run.progress, qa.pipeline.progress), never a live bar's frames, and the run's length from its first items' rate
before the first arm ends; on the tiny random Llama of tests/tiny_models.py saved as a model folder, 3 items per
task."""

from __future__ import annotations

import io
import math
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from evals.errors import EvalError
from evals.run import progress
from evals.run.progress import LineProgress, ProgressSettings, clock, settings_from_env, task_progress
from tests.shared_data import shared_data_dir

SPEC = """
name = "piped"
model = "MODEL"
seed = 3
[calibration]
n_samples = 2
seq_len = 32
observer = "absmax"
[arms.baseline]
engine_args = { batch_size = 2 }
[arms.candidate]
engine_args = { batch_size = 2, kv = { format = "nvfp4", scales = "static" } }
[[tasks]]
name = "arc_easy"
limit = 3
[[tasks]]
name = "mmlu"
limit = 2
"""
LINE = re.compile(r"^(start|progress|done): (\w+)/(\w+) (\d+)/(\d+) items, ([\d.]+|--) items/s, "
                  r"elapsed \d+:\d\d:\d\d, left (\d+:\d\d:\d\d|--)$")
RUN_ESTIMATE = re.compile(r"^estimate: run: the first (\d+) items of (\w+/\w+) took \d+:\d\d:\d\d \(([\d.]+) items/s\): "
                          r"~(\d+):(\d\d):(\d\d) more for the (\d+) samples left in the run's arms at that rate "
                          r"\(rough: tasks differ in cost per item; the run is estimated again after its first arm\)$",
                          re.MULTILINE)
LIVE = re.compile(r"\r|\x1b\[|━━━━.*\d+/\d+")  # a carriage return, an ANSI escape, a bar: a live display's frames


@pytest.fixture(scope="module")
def piped(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """`qa run` of a two-arm, two-task spec with stdout and stderr going to one pipe."""
    from tests.evals.hf_fixtures import save_tiny

    root = tmp_path_factory.mktemp("piped")
    spec = root / "spec.toml"
    spec.write_text(SPEC.replace("MODEL", str(save_tiny(root / "tiny"))), encoding="utf-8")
    env = {**os.environ, "QA_DATA_DIR": str(shared_data_dir("arc_easy")), "OMP_NUM_THREADS": "1",
           "QA_PROGRESS_INTERVAL": "0.05"}
    env.pop("QA_PROGRESS", None)  # the mode is chosen from the pipe
    return subprocess.run([sys.executable, "-m", "qa.cli", "run", str(spec), "--out", str(root / "run")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=600,
                          check=False)


def test_a_piped_run_prints_plain_lines_per_arm_and_task(piped: subprocess.CompletedProcess[str]) -> None:
    out = piped.stdout
    assert piped.returncode in (0, 1, 3), out
    assert not LIVE.search(out), out
    header = next(line for line in out.splitlines() if line.startswith("planned per arm:"))
    assert header.startswith("planned per arm: arc_easy 3, mmlu 2 (5 samples); arms that run: baseline, candidate "
                             "(10 samples in all)")
    lines = [m.groups() for m in map(LINE.match, out.splitlines()) if m]
    for arm in ("baseline", "candidate"):
        for task, n in (("arc_easy", 3), ("mmlu", 2)):
            mine = [g for g in lines if g[1:3] == (arm, task)]
            assert mine[0][0] == "start" and mine[0][3:5] == ("0", str(n)), mine
            assert mine[-1][0] == "done" and mine[-1][3:5] == (str(n), str(n)), mine
            assert mine[-1][5] != "--" and mine[-1][6] == "0:00:00", mine  # a rate, nothing left
    assert re.search(r"^estimate: baseline took \d+:\d\d:\d\d; the 1 arm\(s\) after it ~\d+:\d\d:\d\d more", out, re.MULTILINE)
    # the run's length, once, from the first chunk of the first task of the first arm, before that arm ends
    (whole,) = list(RUN_ESTIMATE.finditer(out))
    done, task, rate, left = int(whole[1]), whole[2], float(whole[3]), int(whole[7])
    seconds = int(whole[4]) * 3600 + int(whole[5]) * 60 + int(whole[6])
    assert task == "baseline/arc_easy" and 0 < done <= 3 and left == 10 - done, whole[0]
    assert seconds > 0 and abs(seconds - math.ceil(left / rate)) <= 1, whole[0]  # the rate is printed rounded
    assert out.index("start: baseline/arc_easy") < whole.start() < out.index("done: baseline/mmlu")
    assert out.index("planned per arm:") < out.index("start: baseline/arc_easy") < out.index("start: candidate/")
    # calibration runs before any arm, silent for minutes on a CPU otherwise: a line when it starts and ends
    assert ("calibration: 2 x 32 tokens of wikitext2, absmax observer, nvfp4 scales for arm 'candidate': started"
            in out.splitlines())
    assert re.search(r"^calibration: done in \d+ s$", out, re.MULTILINE)
    assert out.index("calibration: done") < out.index("start: baseline/arc_easy")


def test_a_line_every_interval_and_an_estimate_after_the_first_chunk(capsys: pytest.CaptureFixture[str]) -> None:
    settings = ProgressSettings("lines", interval_s=0.05, arms=2)
    with task_progress("base/gsm8k", 10, settings) as bar:
        time.sleep(0.3)  # ~5 ticks before the first chunk: the count stays, no rate yet
        bar.advance(4)
        time.sleep(0.12)
        bar.advance(6)
    err = capsys.readouterr().err.splitlines()
    ticks = [line for line in err if line.startswith("progress: base/gsm8k 0/10 items, -- items/s")]
    assert len(ticks) >= 3, err
    estimate = next(line for line in err if line.startswith("estimate:"))
    assert re.fullmatch(r"estimate: base/gsm8k: the first 4 items took 0:00:00: ~0:00:01 for its 10 items in this "
                        r"arm, ~0:00:0[12] in the 2 arms that run it", estimate), estimate
    assert err[0].startswith("start: base/gsm8k 0/10 items") and err[-1].startswith("done: base/gsm8k 10/10 items")


def test_a_task_stopped_early_says_stopped() -> None:
    out = io.StringIO()
    try:
        with LineProgress("a/t", 5, ProgressSettings("lines", interval_s=60), out=out) as bar:
            bar.advance(2)
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert out.getvalue().splitlines()[-1].startswith("stopped: a/t 2/5 items")


def test_the_mode_comes_from_the_environment_or_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QA_PROGRESS", raising=False)
    assert settings_from_env().mode == "lines"  # pytest captures stdout: not a terminal
    assert settings_from_env(enabled=False).mode == "off"
    monkeypatch.setenv("QA_PROGRESS", "bars")
    assert settings_from_env().mode == "bars"
    monkeypatch.setenv("QA_PROGRESS", "dots")
    with pytest.raises(EvalError, match=r"QA_PROGRESS='dots': expected one of bars, lines, off"):
        settings_from_env()
    monkeypatch.setenv("QA_PROGRESS", "lines")
    monkeypatch.setenv("QA_PROGRESS_INTERVAL", "-1")
    with pytest.raises(EvalError, match="QA_PROGRESS_INTERVAL='-1': expected a positive number"):
        settings_from_env()
    assert clock(3725.4) == "1:02:05"


def test_the_run_length_is_told_once_per_process_in_either_mode(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress, "_RUN_TOLD", threading.Event())  # a process that has not told it yet
    lines = io.StringIO()
    with LineProgress("base/gsm8k", 10, ProgressSettings("lines", interval_s=60, run_samples=40), out=lines) as bar:
        time.sleep(0.2)
        bar.advance(4)
        bar.advance(6)
    told = [m for m in map(RUN_ESTIMATE.match, lines.getvalue().splitlines()) if m]
    assert len(told) == 1 and told[0].group(1, 2) == ("4", "base/gsm8k") and told[0][7] == "36", lines.getvalue()
    rate = float(told[0][3])
    assert 0 < rate <= 4 / 0.2  # 4 items after at least 0.2 s
    seconds = int(told[0][4]) * 3600 + int(told[0][5]) * 60 + int(told[0][6])
    assert abs(seconds - 36 / rate) <= 1.01, told[0][0]  # ~1.8 s at ~20 items/s, rounded up
    again = io.StringIO()  # a later task of the same process: not again
    with LineProgress("base/mmlu", 5, ProgressSettings("lines", interval_s=60, run_samples=40), out=again) as bar:
        bar.advance(5)
    assert "estimate: run:" not in again.getvalue()

    monkeypatch.setattr(progress, "_RUN_TOLD", threading.Event())  # a terminal: above the live bar
    with task_progress("base/gsm8k", 10, ProgressSettings("bars", run_samples=40)) as live:
        time.sleep(0.1)
        live.advance(2)
        live.advance(8)
    err = capsys.readouterr().err
    assert len(RUN_ESTIMATE.findall(err)) == 1 and "the first 2 items of base/gsm8k" in err, err
