"""Sequential looks in `qa run` on the hf engine (tiny random Llamas of tests/tiny_models.py saved as
model folders): the arms advance together in blocks in the seeded item order, one engine per arm for the
whole run, a task stops for a candidate at the look that decides it, and a killed run resumes to the same
looks and decision without running a block twice.

One run (baseline, `same` = the baseline's model, `other` = another model; ARC-Easy, 16 items, looks at
0.5 and 1.0) is made once per module; the kill-and-resume test makes the same run again and kills it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evals.records.samples import read_records
from evals.run.selection import select_items
from evals.tasks import get_task
from qa import api
from qa.errors import QAError
from qa.files.rundir import RunDir
from qa.files.spec import parse_spec
from tests.shared_data import shared_data_dir

N_ITEMS, N_MMLU, SEED = 16, 8, 11
# ARC-Easy: identical arms differ on no item, and their exact bound at n = 8 under Pocock's level lies
# inside a 50-point margin, so `same` passes at the first look and stops after half the items.
# MMLU: min_n = 100 > 8 items, so no look can pass, and identical arms never fail: `same` runs every block.
POLICY = """
version = 1
name = "sequential-test"
[default]
margin = 0.5
min_n = 4
looks = [0.5, 1.0]
spending = "pocock"
[tasks.mmlu]
margin = 0.5
min_n = 100
looks = [0.5, 1.0]
spending = "obrien_fleming"
"""
SPEC = f"""
name = "seq"
model = "MODEL_A"
seed = {SEED}
policy = "policy.toml"
[arms.baseline]
engine_args = {{ batch_size = 4 }}
[arms.same]
engine_args = {{ batch_size = 4 }}
[arms.other]
model = "MODEL_B"
engine_args = {{ batch_size = 4 }}
[[tasks]]
name = "arc_easy"
limit = {N_ITEMS}
[[tasks]]
name = "mmlu"
limit = {N_MMLU}
"""


def _data() -> Path:
    return shared_data_dir("arc_easy")


def _events(run: Path) -> list[dict]:
    path = RunDir(run).sequential_log
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tiny models (seeds 0 and 1), the policy and the spec, side by side."""
    from tests.evals.hf_fixtures import save_tiny
    from tests.tiny_models import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("seq")
    save_tiny(root / "a")
    tok = tiny_tokenizer()
    tiny_model(len(tok), seed=1).save_pretrained(root / "b")
    tok.save_pretrained(root / "b")
    (root / "policy.toml").write_text(POLICY, encoding="utf-8")
    text = SPEC.replace("MODEL_A", str(root / "a")).replace("MODEL_B", str(root / "b"))
    (root / "spec.toml").write_text(text, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def run(folder: Path) -> Path:
    """The uninterrupted sequential run."""
    out = folder / "run"
    api.run(folder / "spec.toml", out, data_dir=_data())
    return out


def _looks(run: Path, cand: str) -> list[dict]:
    return [s.model_dump(mode="json") for s in RunDir(run).candidate(cand).load_comparison().sequential]


def _sequential(run: Path, cand: str) -> dict:  # task -> SequentialTask
    return {s.task: s for s in RunDir(run).candidate(cand).load_comparison().sequential}


def test_blocks_follow_the_seeded_order_and_stop_where_a_look_decides(folder: Path, run: Path) -> None:
    rd = RunDir(run)
    sizes = {t.name: tuple(t.look_sizes) for t in rd.load_resolved().tasks}  # what the run resolved
    assert sizes == {"arc_easy": (8, 16), "mmlu": (4, 8)}
    for task, limit in (("arc_easy", N_ITEMS), ("mmlu", N_MMLU)):
        selection = select_items(get_task(task).items(_data()), limit, SEED)
        used = {}
        for cand in ("same", "other"):
            seq = _sequential(run, cand)[task]
            used[cand] = seq.items_used
            assert seq.items_used + seq.items_saved == limit == seq.n_planned
            assert [lk.n for lk in seq.looks] == list(sizes[task][: len(seq.looks)])
            ids = {r.item_id for r in read_records(rd.arm_records(cand) / f"{task}.jsonl")}
            # the candidate ran exactly the first items_used items of the seeded order: later blocks never ran
            assert ids == {it.item_id for it in select_items(selection, seq.items_used, SEED)}
            est = next(e for e in rd.candidate(cand).load_comparison().estimates if e.task == task)
            assert est.n == seq.items_used  # comparison.json: the items the task used
        base = read_records(rd.arm_records("baseline") / f"{task}.jsonl")
        assert len(base) == max(used.values())  # the baseline ran while any candidate still needed a block
    same = _sequential(run, "same")
    assert (same["arc_easy"].stopped_at, same["arc_easy"].decision, same["arc_easy"].items_used) == (0, "pass", 8)
    assert (same["mmlu"].stopped_at, same["mmlu"].decision, len(same["mmlu"].looks)) == (None, "final", 2)


def test_each_arm_started_its_engine_once_and_served_every_block(run: Path) -> None:
    events = _events(run)
    starts = {e["arm"]: e["pid"] for e in events if e["event"] == "start"}
    assert sorted(starts) == ["baseline", "other", "same"]
    assert len([e for e in events if e["event"] == "start"]) == 3  # one worker (one engine) per arm
    blocks = [e for e in events if e["event"] == "block"]
    assert all(e["pid"] == starts[e["arm"]] for e in blocks)  # every block served by the arm's one process
    looked = {(t, lk.look) for c in ("same", "other") for t, s in _sequential(run, c).items() for lk in s.looks}
    assert {(e["task"], e["look"]) for e in blocks if e["arm"] == "baseline"} == looked  # a block per look taken
    assert len([e for e in blocks if e["arm"] == "baseline"]) == len(looked)
    assert [(e["task"], e["look"]) for e in blocks if e["arm"] == "same"] == [
        ("arc_easy", 0), ("mmlu", 0), ("mmlu", 1)]  # arc_easy stopped at its first look


def test_a_killed_run_resumes_to_the_same_looks_without_running_a_block_twice(folder: Path, run: Path) -> None:
    out = folder / "killed"
    cmd = [str(Path(sys.executable).parent / "qa"), "run", str(folder / "spec.toml"), "--out", str(out),
           "--data-dir", str(_data())]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    try:  # kill the run (and its workers) once the baseline's second block is on disk
        while not any((e.get("task"), e.get("look"), e["arm"]) == ("mmlu", 1, "baseline") for e in _events(out)):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the kill"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = _events(out)
    api.run(folder / "spec.toml", out, data_dir=_data())
    after = _events(out)[len(before):]
    assert _looks(out, "same") == _looks(run, "same")
    assert _looks(out, "other") == _looks(run, "other")
    for arm in ("baseline", "same", "other"):
        for task in ("arc_easy", "mmlu"):
            mine = read_records(RunDir(out).arm_records(arm) / f"{task}.jsonl")
            ref = read_records(RunDir(run).arm_records(arm) / f"{task}.jsonl")
            assert sorted(r.key for r in mine) == sorted(r.key for r in ref)  # no sample twice, none missing
            assert {r.key: r.scores for r in mine} == {r.key: r.scores for r in ref}
    finished = {(e["arm"], e["task"], e["look"]) for e in before if e["event"] == "block"}
    assert ("same", "mmlu", 1) not in finished  # the kill came before the candidates' last block
    for e in after:
        if e["event"] == "block" and (e["arm"], e["task"], e["look"]) in finished:
            assert e["written"] == 0 and e["pid"] is None, e  # a block on disk before the kill is not sent again
    started = {e["arm"]: e["pid"] for e in after if e["event"] == "start"}
    ran = {e["arm"] for e in after if e["event"] == "block" and e["pid"] is not None}
    assert set(started) == ran and len(started) == len([e for e in after if e["event"] == "start"])  # once each
    assert all(e["pid"] == started[e["arm"]] for e in after if e["event"] == "block" and e["pid"] is not None)
    api.run(folder / "spec.toml", out, data_dir=_data())  # everything on disk: no worker starts at all
    assert not [e for e in _events(out)[len(before) + len(after):] if e["event"] == "start"]


class CallLog:
    """The real tiny hf engine, noting the contexts of every batch the runner sends it."""

    def __init__(self, engine) -> None:  # type: ignore[no-untyped-def]
        self.engine, self.batches = engine, []

    @property
    def info(self):  # type: ignore[no-untyped-def]
        return self.engine.info

    def loglikelihood(self, requests):  # type: ignore[no-untyped-def]
        self.batches.append([r.context for r in requests])
        return self.engine.loglikelihood(requests)


def test_runner_blocks_are_chunked_alone_so_a_resumed_run_makes_the_same_batches(tmp_path: Path) -> None:
    from evals.run.runner import run_task
    from tests.evals.hf_fixtures import tiny_engine

    task, engine = get_task("arc_easy"), tiny_engine({"batch_size": 4})
    common = {"arm": "a", "limit": 10, "seed": SEED, "data_dir": _data(), "chunk": 3, "progress": False}
    whole, cut = CallLog(engine), CallLog(engine)
    run_task(whole, task, out_path=tmp_path / "whole.jsonl", blocks=(4, 10), **common)
    run_task(cut, task, out_path=tmp_path / "cut.jsonl", blocks=(4,), **common)  # stopped after the first look
    assert len(read_records(tmp_path / "cut.jsonl")) == 4
    run_task(cut, task, out_path=tmp_path / "cut.jsonl", blocks=(4, 10), **common)  # resumed: the rest only
    assert [len(b) for b in whole.batches] == [3, 1, 3, 3]  # block 1 (4 items), block 2 (6 items), chunked alone
    assert cut.batches == whole.batches
    assert (tmp_path / "cut.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    selection = select_items(task.items(_data()), 10, SEED)
    first = {it.item_id for it in select_items(selection, 4, SEED)}
    assert {r.item_id for r in read_records(tmp_path / "whole.jsonl")[:4]} == first  # the seeded order's first


def test_too_few_items_for_the_looks_is_refused_before_any_engine_starts(folder: Path, tmp_path: Path) -> None:
    spec = parse_spec((folder / "spec.toml").read_text(encoding="utf-8").replace(f"limit = {N_MMLU}", "limit = 1"))
    with pytest.raises(QAError, match="cannot make 2 sequential looks"):
        api.run(spec, tmp_path / "run", data_dir=_data(), spec_dir=folder)
    assert not RunDir(tmp_path / "run").sequential_log.exists()
