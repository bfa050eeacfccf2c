"""Sequential looks in `qa run`: for a policy with looks, every arm's worker stays alive for the whole
run (`python -m qa.pipeline.worker RUN_DIR ARM --serve`: one engine, and one local server, per arm), the arms run
the same items in blocks in the seeded item order, and the gate looks after each block.

Block k of a task is the items [n_{k-1}, n_k) of its selection ranked by `evals.run.selection.select_items`
(the first n_k items are `select_items(selection, n_k, seed)`; n_k from `qa.stats.sequential.look_sizes`).
At look k each candidate is compared with the baseline on the records of the first n_k items (qa.compare.arms,
the rerun arm filtered the same way) and `qa.gate.sequential.look_decision` decides: a task that passed
or failed stops for that candidate (its later blocks are not run), the others go on; the baseline and the
rerun run a block while any candidate still needs it; a reused baseline (`from`) runs nothing. Each
candidate's comparison.json is the comparison of the items each task used, with the history of its looks
(`Comparison.sequential`); gate and report then run as at fixed n.

A look is a function of the records of the first n_k items only, so a killed run restarted with the same
command recomputes the same looks and decisions and runs no block twice: a block already on disk is not
sent to a worker, an arm starts its worker only at its first block that is not, and the runner skips
finished samples and chunks each block alone, so a resumed run makes the same batches. Every worker start and
block is appended to logs/sequential.jsonl (`RunDir.sequential_log`).

Worker protocol: the worker writes {"ready": true, "pid": ...} once its engine is built, then answers each
command line on stdin, {"task": T, "blocks": [n_1, ..., n_k]} (run T's first n_k items) with one JSON
line ({"error": "..."} on a user error); {"cmd": "close"} or end of input ends it. Answers go to the
worker's original stdout; whatever else it prints goes to stderr.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from qa.compare.arms import Arm, compare_arms, load_arm
from qa.errors import QAError
from qa.files.comparison import Comparison, Estimate, SequentialLook, SequentialTask, StatsSettings
from qa.files.rundir import RunDir
from qa.gate.rules import select_estimate
from qa.gate.sequential import look_decision, sequential_task
from qa.pipeline.processes import RESUME_HINT, start_arm_worker
from qa.pipeline.resolved_run import ResolvedArm, ResolvedRun, ResolvedTask
from qa.pipeline.resume import arm_matches, on_disk

CLOSE_TIMEOUT_S = 120.0  # a worker asked to close gets this long to close its engine and server


class ArmWorker:
    """One arm's serving worker, seen from `qa run`: started when a block it must run is not on disk yet (a
    resumed run starts none for an arm whose blocks are all written); send a block, read its answer."""

    def __init__(self, run: ResolvedRun, arm: ResolvedArm) -> None:
        self.run, self.arm = run, arm
        self.matches = arm_matches(run, arm)  # its arm.json is this arm's: records on disk count as done
        self.proc: subprocess.Popen[str] | None = None

    @property
    def role(self) -> str:
        return self.arm.name

    def start(self) -> None:
        """Start the worker and wait until its engine is built (logged as a start)."""
        self.proc = start_arm_worker(self.run.rd.top, self.arm.record)
        log_event(self.run.rd, event="start", arm=self.role, pid=self.read()["pid"])

    def read(self) -> dict[str, Any]:
        """The worker's next answer; QAError when it stopped or answered an error."""
        assert self.proc is not None and self.proc.stdout is not None  # started with pipes
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            raise QAError(f"arm {self.role!r} stopped with exit code {rc} (see its error above); {RESUME_HINT}")
        answer = json.loads(line)
        if "error" in answer:
            raise QAError(f"arm {self.role!r}: {answer['error']}")
        return answer

    def run_block(self, task: ResolvedTask, blocks: Sequence[int] | None) -> dict[str, Any]:
        """Run `task`'s first blocks[-1] items (None: all of them) and wait until they are on disk; a block
        already on disk is not sent (its answer says what is there, pid None)."""
        ids = None if blocks is None else task.first(blocks[-1], self.run.seed)
        if self.proc is None and self.matches and on_disk(self.run, self.arm, task, ids):
            n = (task.n_items if ids is None else len(ids)) * task.repeats
            return {"task": task.name, "written": 0, "skipped": n, "errors": 0, "seconds": 0.0, "pid": None}
        if self.proc is None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"task": task.name, "blocks": None if blocks is None else list(blocks)})
                                  + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it stopped: read() says how
        return self.read()

    def close(self) -> None:
        """Ask a started worker to close its engine and exit; kill it if it does not."""
        if self.proc is None:
            return
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "close"}) + "\n")
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        try:
            self.proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def log_event(rd: RunDir, **event: Any) -> None:
    """Append one line to logs/sequential.jsonl."""
    path = rd.sequential_log
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(event, sort_keys=True) + "\n")


@contextmanager
def serving(run: ResolvedRun, arms: Sequence[ResolvedArm]) -> Iterator[dict[str, ArmWorker]]:
    """Every arm's serving worker (each started at its first block that is not on disk); closed after."""
    workers = {arm.name: ArmWorker(run, arm) for arm in arms}
    try:
        yield workers
    finally:
        for worker in workers.values():
            worker.close()


def filtered_arm(path: Path, keep: Mapping[str, frozenset[str] | None]) -> Arm:
    """An arm's records of the tasks in `keep`, each limited to its item ids (None: all of them)."""
    arm = load_arm(path)
    records = tuple(r for r in arm.records if r.task in keep and (keep[r.task] is None or r.item_id in keep[r.task]))
    return Arm(label=arm.label, format=arm.format, records=records)


def compare_items(run: ResolvedRun, candidate: ResolvedArm, keep: Mapping[str, frozenset[str] | None]) -> Comparison:
    """The comparison of `candidate` with the baseline (and the rerun) on the items in `keep` only."""
    rerun = next((a for a in run.arms if a.record.kind == "rerun"), None)
    return compare_arms(filtered_arm(run.records_of(run.arm("baseline")), keep),
                        filtered_arm(run.records_of(candidate), keep), StatsSettings(seed=run.seed),
                        rerun=filtered_arm(run.records_of(rerun), keep) if rerun is not None else None)


def gated(comparison: Comparison, task: ResolvedTask) -> Estimate | None:
    """The estimate the gate decides `task` on (None: the task has no accuracy estimate)."""
    if not any(e.task == task.name for e in comparison.estimates):
        return None
    return select_estimate(comparison, task.name, task.policy, task.explicit)


def look_line(candidate: str, task: ResolvedTask, look: SequentialLook) -> str:
    """One line printed per look: where, how many items, the adjusted interval and the decision."""
    ci = ("undefined" if look.lower is None or look.upper is None
          else f"[{100 * look.lower:+.1f}, {100 * look.upper:+.1f}] pts")
    return (f"look {look.look + 1}/{len(task.look_sizes)} {candidate}/{task.name}: n = {look.n} of {task.n_items}, "
            f"{100 * look.adjusted_level:.2f}% CI {ci} (margin -{100 * task.policy.margin:.1f} pts): {look.decision}")


def run_sequential(run: ResolvedRun) -> dict[str, Comparison]:
    """Run the arms in blocks with a look after each (module doc); write each candidate's comparison.json
    (in `ResolvedRun.out`) with its looks, and return them by candidate."""
    looked = [t for t in run.tasks if t.look_sizes]
    cands = [c.name for c in run.candidates]
    running = [a for a in run.arms if a.record.runs]
    looks: dict[tuple[str, str], list[SequentialLook]] = {(c, t.name): [] for c in cands for t in looked}
    ended: dict[str, dict[str, int]] = {c: {} for c in cands}  # candidate -> task -> its last look
    records: dict[str, list[SequentialTask]] = {c: [] for c in cands}
    with serving(run, running) as workers:
        for task in (t for t in run.tasks if not t.look_sizes):  # tasks without looks run whole, once
            for name, worker in workers.items():
                log_event(run.rd, event="block", arm=name, look=None, **worker.run_block(task, None))
        for k in range(max((len(t.look_sizes) for t in looked), default=0)):
            for task in looked:
                going = [c for c in cands if task.name not in ended[c]]
                if k >= len(task.look_sizes) or not going:
                    continue
                for name, worker in workers.items():  # the baseline and the rerun while any candidate goes on
                    if name not in cands or name in going:
                        answer = worker.run_block(task, task.look_sizes[: k + 1])
                        log_event(run.rd, event="block", arm=name, look=k, n=task.look_sizes[k], **answer)
            for cand in run.candidates:
                active = [t for t in looked if t.name not in ended[cand.name] and k < len(t.look_sizes)]
                if not active:
                    continue
                comparison = compare_items(run, cand, {t.name: t.first(t.look_sizes[k], run.seed) for t in active})
                for task in active:
                    est, history = gated(comparison, task), looks[(cand.name, task.name)]
                    if est is not None:
                        history.append(look_decision(est, task.policy, k, task.n_items))
                        print(look_line(cand.name, task, history[-1]), flush=True)
                    if k == len(task.look_sizes) - 1 or (history and history[-1].decision != "continue"):
                        ended[cand.name][task.name] = k
                        if est is not None:
                            records[cand.name].append(sequential_task(est, task.policy, history, task.n_items))
    out: dict[str, Comparison] = {}
    for cand in run.candidates:
        keep = {t.name: t.first(t.look_sizes[ended[cand.name][t.name]], run.seed) if t.look_sizes else None
                for t in run.tasks}
        comparison = compare_items(run, cand, keep).model_copy(update={"sequential": records[cand.name]})
        run.out(cand).save_comparison(comparison)
        out[cand.name] = comparison
    return out
