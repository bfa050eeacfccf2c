"""Crash safety of `qa run`: SIGKILL at 20 seeded random moments, restart, same result as a clean run.

The slow test runs a real, tiny spec (SmolLM2, calibration + two hf arms + compare + report) once
uninterrupted and once killed 20 times. Each kill waits for a moment of the timeline seen from the
run directory and the live `qa.pipeline.worker` children (model load, calibration, a records file
growing, compare, report), adds a seeded random delay and SIGKILLs the whole process group, as an
OOM killer or a lost machine would. After each kill the same command is started again. A torn
JSONL line cannot come from SIGKILL (one record is one write() call), only from power loss, so
twice the last line of the file being written is cut in half after the kill: the restart must
warn and redo that sample. The killed run's records must then equal the clean run's byte for byte
(the hf engine on CPU is deterministic): nothing lost, nothing written twice, no torn line kept.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from evals.records.samples import read_records
from tests.shared_data import shared_data_dir

ROOT = Path(__file__).resolve().parent.parent
KILL_SEED = 20240611
POLL_S = 0.01


def _data_dir() -> Path:
    return shared_data_dir("wikitext2")


SPEC = """\
name = "crash"
model = "smollm2-135m"
seed = 11
[calibration]
n_samples = 2
seq_len = 64
observer = "absmax"
[arms.baseline]
engine = "hf"
engine_args = { batch_size = 4 }
[arms.candidate]
engine = "hf"
engine_args = { batch_size = 4, kv = { format = "nvfp4", scales = "static" } }
[[tasks]]
name = "arc_easy"
limit = 6
[[tasks]]
name = "wikitext_kl"
limit = 2
max_tokens = 128
"""
EXPECTED_LINES = {"arc_easy": 6, "wikitext_kl": 2}


# ------------------------------------------------------------------------ watching a live run


def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (Linux /proc)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _workers(pid: int) -> set[str]:
    """Roles of the live `qa.pipeline.worker` children (calibrate, baseline, candidate)."""
    roles: set[str] = set()
    for child in _descendants(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"qa.pipeline.worker" in argv:
            roles.add(argv[argv.index(b"qa.pipeline.worker") + 2].decode())
    return roles


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _newer(path: Path, since: float) -> bool:
    return path.exists() and path.stat().st_mtime >= since


Ready = Callable[[Path, int, float, dict[str, int]], bool]  # (run dir, pid, launched at, sizes at launch)


@dataclass(frozen=True)
class Moment:
    """A kill: wait until `ready` (or until `passed`: the stage is already over), then up to `max_delay` s."""

    name: str
    ready: Ready
    passed: Callable[[Path], bool]
    max_delay: float
    tear: str | None = None  # records file ("baseline/arc_easy") whose last line is torn after the kill


def _records(run: Path, arm: str, task: str) -> Path:
    return run / "records" / arm / f"{task}.jsonl"


def _arm_done(arm: str) -> Callable[[Path], bool]:
    return lambda run: all(_lines(_records(run, arm, t)) == n for t, n in EXPECTED_LINES.items())


def _all_records(run: Path) -> bool:
    return _arm_done("baseline")(run) and _arm_done("candidate")(run)


def _calibrated(run: Path) -> bool:
    return (run / "calibration" / "kv_scales.json").exists()


def _always(run: Path, pid: int, t0: float, sizes: dict[str, int]) -> bool:
    return True


def _never(run: Path) -> bool:
    return False


def _calibrating(run: Path, pid: int, t0: float, sizes: dict[str, int]) -> bool:
    return "calibrate" in _workers(pid)


def _arm_started(arm: str) -> Ready:
    return lambda run, pid, t0, sizes: _newer(run / "records" / arm / "arm.json", t0)


def _grew(arm: str, task: str) -> Ready:
    def ready(run: Path, pid: int, t0: float, sizes: dict[str, int]) -> bool:
        p = _records(run, arm, task)
        return p.exists() and p.stat().st_size > sizes.get(f"{arm}/{task}", 0)
    return ready


def _mid(arm: str, done_task: str) -> Ready:
    def ready(run: Path, pid: int, t0: float, sizes: dict[str, int]) -> bool:
        return (arm in _workers(pid) and _newer(run / "records" / arm / "arm.json", t0)
                and _lines(_records(run, arm, done_task)) == EXPECTED_LINES[done_task])
    return ready


def _compared(run: Path, pid: int, t0: float, sizes: dict[str, int]) -> bool:
    return _all_records(run) and not _workers(pid)


# In timeline order; 20 in all, spread over every stage of the run.
MOMENTS: tuple[Moment, ...] = (
    Moment("startup", _always, _never, 3.0),
    Moment("startup", _always, _never, 3.0),
    Moment("calibration", _calibrating, _calibrated, 4.0),
    Moment("calibration", _calibrating, _calibrated, 8.0),
    Moment("calibration written", lambda run, pid, t0, s: _newer(run / "calibration" / "kv_scales.safetensors", t0),
           _calibrated, 0.0),
    Moment("baseline model load", _arm_started("baseline"), _never, 1.0),
    Moment("baseline model load", _arm_started("baseline"), _never, 2.0),
    Moment("baseline record write", _grew("baseline", "arc_easy"), _arm_done("baseline"), 0.0, tear="baseline/arc_easy"),
    Moment("baseline mid-task", _mid("baseline", "arc_easy"), _arm_done("baseline"), 3.0),
    Moment("baseline mid-task", _mid("baseline", "arc_easy"), _arm_done("baseline"), 3.0),
    Moment("candidate model load", _arm_started("candidate"), _never, 1.0),
    Moment("candidate model load", _arm_started("candidate"), _never, 2.0),
    Moment("candidate record write", _grew("candidate", "arc_easy"), _arm_done("candidate"), 0.0,
           tear="candidate/arc_easy"),
    Moment("candidate mid-task", _mid("candidate", "arc_easy"), _arm_done("candidate"), 4.0),
    Moment("candidate mid-task", _mid("candidate", "arc_easy"), _arm_done("candidate"), 4.0),
    Moment("candidate record write", _grew("candidate", "wikitext_kl"), _arm_done("candidate"), 0.0),
    Moment("compare", _compared, _never, 1.0),
    Moment("compare", _compared, _never, 1.0),
    Moment("report", lambda run, pid, t0, s: _newer(run / "comparison.json", t0), _never, 0.3),
    Moment("report", lambda run, pid, t0, s: _newer(run / "verdict.json", t0), _never, 0.3),
)


def _phase(run: Path, pid: int) -> str:
    """What a kill of `pid` hits now, seen from outside."""
    workers = _workers(pid)
    if workers:
        return "worker:" + ",".join(sorted(workers))
    if not (run / "env.json").exists():
        return "startup"
    return "compare/report" if _all_records(run) else "main"


def _launch(spec: Path, run: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "QA_DATA_DIR": str(_data_dir()), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with open(log, "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "qa.cli", "run", str(spec), "--out", str(run)], cwd=ROOT,
                                env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tear(path: Path) -> None:
    """Cut the last line in half, as a write torn by power loss leaves it."""
    raw = path.read_bytes()
    head, last = raw[:-1].rsplit(b"\n", 1) if raw[:-1].count(b"\n") else (b"", raw[:-1])
    path.write_bytes((head + b"\n" if head else b"") + last[: len(last) // 2])


def _sizes(run: Path) -> dict[str, int]:
    return {f"{p.parent.name}/{p.stem}": p.stat().st_size for p in run.glob("records/*/*.jsonl")}


def _killed_run(spec: Path, run: Path, logs: Path) -> list[str]:
    """Run with every kill of MOMENTS; returns what each kill hit. Asserts each torn line was warned about."""
    rng = random.Random(KILL_SEED)
    hit: list[str] = []
    attempt = 0
    expect_warning: str | None = None
    for moment in MOMENTS:
        delay = rng.uniform(0.0, moment.max_delay)
        for _ in range(3):  # the run may finish before the moment comes: start it again (a rerun re-reports)
            attempt += 1
            log = logs / f"attempt{attempt:02d}.log"
            sizes, t0 = _sizes(run), time.time()
            proc = _launch(spec, run, log)
            while proc.poll() is None and not moment.ready(run, proc.pid, t0, sizes) and not moment.passed(run):
                time.sleep(POLL_S)
            if proc.poll() is None:
                time.sleep(delay)
            phase = _phase(run, proc.pid)
            finished = proc.poll() is not None
            _kill_group(proc)
            if expect_warning is not None:
                assert "dropping a torn last line" in log.read_text() and expect_warning in log.read_text()
                expect_warning = None
            if not finished:
                hit.append(phase)
                break
            assert proc.returncode in (0, 1, 3), log.read_text()[-2000:]
        else:
            pytest.fail(f"kill {moment.name!r} never landed")
        if moment.tear:
            path = run / "records" / f"{moment.tear}.jsonl"
            if path.exists() and path.stat().st_size:
                _tear(path)
                expect_warning = path.name
    return hit


def test_resume_inside_a_chunk_reruns_the_whole_chunk_so_batches_match(tmp_path: Path) -> None:
    """A kill between two records of one chunk: the resumed call must batch exactly as the clean run."""
    from evals.engines.base import GenerateResult
    from evals.run.runner import run_task
    from tests.evals.run.test_runner import EchoTask, FakeEngine

    class BatchSensitive(FakeEngine):  # like float kernels: an answer depends on what shares its batch
        def generate(self, requests):  # type: ignore[no-untyped-def]
            self.calls += 1
            self.seen += [r.prompt for r in requests]
            return [GenerateResult(text=f" {r.prompt.split()[-1]}/{len(requests)}", output_tokens=1,
                                   finish_reason="stop") for r in requests]

    task = EchoTask(n_items=6)
    clean = tmp_path / "clean.jsonl"
    run_task(BatchSensitive(), task, arm="a", out_path=clean, chunk=4, progress=False)
    killed = tmp_path / "killed.jsonl"
    lines = clean.read_bytes().split(b"\n")
    killed.write_bytes(b"\n".join(lines[:2]) + b"\n" + lines[2][:9])  # 2 records of chunk 1, then a torn one
    engine = BatchSensitive()
    summary = run_task(engine, task, arm="a", out_path=killed, chunk=4, progress=False)
    assert (summary.skipped, summary.written) == (2, 4)
    assert len(engine.seen) == 6  # chunk 1 re-run whole (4), chunk 2 (2)
    assert killed.read_bytes() == clean.read_bytes()


def test_calibration_cut_between_its_two_files_is_redone_not_trusted(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill after kv_scales.safetensors but before kv_scales.json: the restart must calibrate again
    (and its preflight must not stop on the half-written pair)."""
    from qa.files.rundir import RunDir
    from qa.files.spec import parse_spec
    from qa.pipeline import processes, stages
    from qa.pipeline.preflight import preflight
    from qa.pipeline.resolve import resolve_run

    run = tmp_path / "run"
    (run / "calibration").mkdir(parents=True)
    RunDir(run).scales.write_bytes(b"left by a killed calibration")
    resolved = resolve_run(parse_spec(SPEC), run, data_dir=_data_dir(), spec_dir=None)
    preflight(resolved)
    started: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        started.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(processes.subprocess, "run", fake_run)
    stages.calibrate(resolved)
    assert len(started) == 1 and started[0][-3:] == ["qa.pipeline.worker", str(run), "calibrate"]
    (run / "calibration" / "kv_scales.json").write_text("{}")
    stages.calibrate(resolved)
    assert len(started) == 1  # both files there: skipped


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux only")
def test_an_arm_process_dies_with_its_qa_run(tmp_path: Path) -> None:
    """SIGKILL of `qa run` alone (not its group) must not leave an orphaned arm appending records."""
    code = ("import subprocess, time\nfrom qa.pipeline.processes import CHILD_SETUP\n"
            "p = subprocess.Popen(['sleep', '120'], preexec_fn=CHILD_SETUP)\nprint(p.pid, flush=True)\ntime.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    state = ""
    while time.monotonic() < deadline:
        try:
            state = next(line for line in Path(f"/proc/{child}/status").read_text().splitlines()
                         if line.startswith("State:"))
        except FileNotFoundError:
            state = "State: gone"
        if "zombie" in state or "gone" in state:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
    assert "zombie" in state or "gone" in state, state


@pytest.mark.slow
def test_twenty_kills_leave_records_identical_to_an_uninterrupted_run(tmp_path: Path) -> None:
    _data_dir()
    spec = tmp_path / "crash.toml"
    spec.write_text(SPEC)
    clean, killed, logs = tmp_path / "clean", tmp_path / "killed", tmp_path / "logs"
    logs.mkdir()
    clean_log = logs / "clean.log"
    proc = _launch(spec, clean, clean_log)
    assert proc.wait() in (0, 1, 3), clean_log.read_text()[-2000:]

    hit = _killed_run(spec, killed, logs)
    assert len(hit) == len(MOMENTS) == 20
    print("kills hit:", hit)
    assert {"startup", "worker:calibrate", "worker:baseline", "worker:candidate", "compare/report"} <= set(hit)
    final_log = logs / "final.log"
    proc = _launch(spec, killed, final_log)
    assert proc.wait() in (0, 1, 3), final_log.read_text()[-2000:]
    assert "Traceback" not in "".join(p.read_text() for p in logs.glob("*.log"))

    for arm in ("baseline", "candidate"):
        for task, n in EXPECTED_LINES.items():
            a, b = _records(clean, arm, task), _records(killed, arm, task)
            recs = read_records(b)
            assert b.read_bytes().endswith(b"\n")  # no torn tail kept
            assert len(recs) == n and len({r.key for r in recs}) == n  # 0 lost, 0 duplicated
            assert [r.model_dump() for r in recs] == [r.model_dump() for r in read_records(a)]
            assert b.read_bytes() == a.read_bytes(), f"{arm}/{task}: records differ from the clean run"
    # Calibration is redone when a kill cut it short. Its float reductions are not guaranteed to be
    # bit-stable across processes (seen once here: the last bits of an amax differed while every record
    # above stayed byte-identical), so the scales must match to float32 rounding and come from the same data.
    from quant.scales.files import KVScales

    cal = [KVScales.load(d / "calibration" / "kv_scales") for d in (clean, killed)]
    assert cal[0].meta.data == cal[1].meta.data
    for name in ("k_amax", "v_amax", "k_scale", "v_scale"):
        assert torch.allclose(getattr(cal[0], name), getattr(cal[1], name), rtol=1e-6, atol=0), name
    assert json.loads((killed / "comparison.json").read_text()) == json.loads((clean / "comparison.json").read_text())
    verdict = [json.loads((d / "verdict.json").read_text()) for d in (clean, killed)]
    assert verdict[0]["status"] == verdict[1]["status"]
    assert (killed / "report.html").read_text().rstrip().endswith("</html>")
    from quant.kv.inspect import load_inspect  # the emulated-cache candidate's per-layer KV numbers

    inspected = [load_inspect(d / "kv_inspect.json") for d in (clean, killed)]
    assert inspected[0] == inspected[1]
    assert inspected[0].spec.format == "nvfp4" and len(inspected[0].layers) == 30  # SmolLM2-135M: 30 layers
    assert all(10 < layer.k.sqnr_db < 40 and 10 < layer.v.sqnr_db < 40 for layer in inspected[0].layers)
    assert "Not deterministic" not in (killed / "report.md").read_text()  # hf on CPU is bit-reproducible
