"""Sequential looks in `qa run`: for a policy with looks, every arm's worker stays alive for the whole
run (`python -m qa.run.worker RUN_DIR ARM --serve`: one engine, and one local server, per arm), the arms run
the same items in blocks in the seeded item order, and the gate looks after each block.

Block k of a task is the items [n_{k-1}, n_k) of its selection ranked by `evals.sampling.select_items`
(the first n_k items are `select_items(selection, n_k, seed)`; n_k from `qa.stats.sequential.look_sizes`).
At look k each candidate is compared with the baseline on the records of the first n_k items (qa.compare.arms,
the rerun arm filtered the same way) and `qa.gate.sequential.look_decision` decides: a task that passed
or failed stops for that candidate (its later blocks are not run), the others go on; the baseline and the
rerun run a block while any candidate still needs it; a reused baseline (`from`) runs nothing. Each
candidate's comparison.json is the comparison of the items each task used, with the history of its looks
(`Comparison.sequential`); gate and report then run as at fixed n.

A look is a function of the records of the first n_k items only, so a killed run restarted with the same
command recomputes the same looks and decisions and runs no block twice: the runner skips finished
samples and chunks each block alone, so a resumed run makes the same batches. Every worker start and
block is appended to logs/sequential.jsonl (`RunDir.sequential_log`).

Worker protocol: the worker writes {"ready": true, "pid": ...} once its engine is built, then answers each
command line on stdin, {"task": T, "blocks": [n_1, ..., n_k]} (run T's first n_k items) with one JSON
line ({"error": "..."} on a user error); {"cmd": "close"} or end of input ends it. Answers go to the
worker's original stdout; whatever else it prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.sampling import select_items
from evals.tasks.base import Item
from qa.compare.arms import Arm, compare_arms, load_arm
from qa.files.comparison import Comparison, Estimate, SequentialLook, SequentialTask, StatsSettings
from qa.errors import USER_ERRORS, QAError
from qa.files.policy import Policy, TaskPolicy
from qa.files.rundir import RunDir
from qa.files.spec import RunSpec

CLOSE_TIMEOUT_S = 120.0  # a worker asked to close gets this long to close its engine and server
RESUME_HINT = "finished samples are kept: re-run the same command to resume"


@dataclass(frozen=True)
class TaskPlan:
    """One task under a sequential policy: its resolved policy, its selection, the items at each look."""

    name: str
    policy: TaskPolicy
    explicit: bool  # named in the policy's [tasks] (qa.gate.rules.select_estimate)
    selection: tuple[Item, ...]
    sizes: tuple[int, ...]  # items at each look, last = len(selection)

    @property
    def n_planned(self) -> int:
        """Items of the whole selection."""
        return len(self.selection)

    def first(self, n: int, seed: int) -> frozenset[str]:
        """Item ids of the first `n` items of the selection in the seeded order."""
        return frozenset(it.item_id for it in select_items(self.selection, n, seed))


def is_sequential(spec: RunSpec, policy: Policy) -> bool:
    """Whether any task of the spec has sequential looks under `policy`."""
    return any(policy.for_task(t.name).looks for t in spec.tasks)


def plan_tasks(spec: RunSpec, policy: Policy, data_dir: Path | None) -> dict[str, TaskPlan]:
    """Each task whose policy has looks, with its selection and look sizes (QAError: too few items)."""
    from evals.tasks import get_task
    from qa.run.arm_inputs import task_options
    from qa.stats.sequential import Design, look_sizes

    plans: dict[str, TaskPlan] = {}
    for t in spec.tasks:
        tp = policy.for_task(t.name)
        if not tp.looks:
            continue
        task = get_task(t.name, task_options(t, spec.chat), spec.model)
        selection = tuple(select_items(task.items(data_dir), t.limit, spec.seed))
        sizes = look_sizes(Design(looks=tp.looks, alpha=tp.alpha, spending=tp.spending), len(selection))
        plans[t.name] = TaskPlan(t.name, tp, t.name in policy.tasks, selection, sizes)
    return plans


def serve_arm(spec: RunSpec, rd: RunDir, role: str, data_dir: Path | None) -> None:
    """`qa.run.worker --serve`: build the arm's engine (and its server) once, then run one block per command."""
    from evals.arm import open_arm
    from qa.run.arm_inputs import arm_config, arm_tasks
    from qa.run.servers import arm_server

    sys.stdout.flush()
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything else printed (a server's address, a library's chatter) goes to stderr

    def answer(obj: Mapping[str, Any]) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    with arm_server(spec, role, rd) as base_url, \
            open_arm(arm_config(spec, role, rd, data_dir, base_url=base_url), arm_tasks(spec), rd.root) as arm:
        answer({"ready": True, "pid": os.getpid()})
        for line in sys.stdin:
            command = json.loads(line)
            if command.get("cmd") == "close":
                break
            try:
                done = arm.run(command["task"], blocks=command["blocks"])
            except USER_ERRORS as exc:
                answer({"error": str(exc)})
                continue
            answer({"task": done.task, "written": done.written, "skipped": done.skipped, "errors": done.errors,
                    "seconds": round(done.seconds, 3), "pid": os.getpid()})


class ArmWorker:
    """One arm's serving worker, seen from `qa run`: send a block, read its answer."""

    def __init__(self, role: str, proc: subprocess.Popen[str]) -> None:
        self.role, self.proc = role, proc

    def read(self) -> dict[str, Any]:
        """The worker's next answer; QAError when it stopped or answered an error."""
        assert self.proc.stdout is not None  # started with pipes
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            raise QAError(f"arm {self.role!r} stopped with exit code {rc} (see its error above); {RESUME_HINT}")
        answer = json.loads(line)
        if "error" in answer:
            raise QAError(f"arm {self.role!r}: {answer['error']}")
        return answer

    def run_block(self, task: str, blocks: Sequence[int] | None) -> dict[str, Any]:
        """Run `task`'s first blocks[-1] items (None: all of them) and wait until they are on disk."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"task": task, "blocks": None if blocks is None else list(blocks)}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it stopped: read() says how
        return self.read()

    def close(self) -> None:
        """Ask the worker to close its engine and exit; kill it if it does not."""
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
def serving(spec: RunSpec, rd: RunDir, roles: Sequence[str], data_dir: Path | None) -> Iterator[dict[str, ArmWorker]]:
    """Start every arm's serving worker (all alive together), wait until each engine is built; close after."""
    from qa.run.processes import start_arm_worker

    workers: dict[str, ArmWorker] = {}
    try:
        for role in roles:
            workers[role] = ArmWorker(role, start_arm_worker(rd.top, role, spec, data_dir))
        for role, worker in workers.items():
            log_event(rd, event="start", arm=role, pid=worker.read()["pid"])
        yield workers
    finally:
        for worker in workers.values():
            worker.close()


def filtered_arm(path: Path, keep: Mapping[str, frozenset[str] | None]) -> Arm:
    """An arm's records of the tasks in `keep`, each limited to its item ids (None: all of them)."""
    arm = load_arm(path)
    records = tuple(r for r in arm.records if r.task in keep and (keep[r.task] is None or r.item_id in keep[r.task]))
    return Arm(label=arm.label, format=arm.format, records=records)


def compare_items(spec: RunSpec, rd: RunDir, candidate: str, keep: Mapping[str, frozenset[str] | None]) -> Comparison:
    """The comparison of `candidate` with the baseline (and the rerun) on the items in `keep` only."""
    from qa.run.pipeline import arm_source

    rerun = filtered_arm(arm_source(spec, "rerun", rd), keep) if "rerun" in spec.arms else None
    return compare_arms(filtered_arm(arm_source(spec, "baseline", rd), keep),
                        filtered_arm(arm_source(spec, candidate, rd), keep), StatsSettings(seed=spec.seed),
                        rerun=rerun)


def gated(comparison: Comparison, plan: TaskPlan) -> Estimate | None:
    """The estimate the gate decides `plan`'s task on (None: the task has no accuracy estimate)."""
    from qa.gate.rules import select_estimate

    if not any(e.task == plan.name for e in comparison.estimates):
        return None
    return select_estimate(comparison, plan.name, plan.policy, plan.explicit)


def look_line(candidate: str, plan: TaskPlan, look: SequentialLook) -> str:
    """One line printed per look: where, how many items, the adjusted interval and the decision."""
    ci = ("undefined" if look.lower is None or look.upper is None
          else f"[{100 * look.lower:+.1f}, {100 * look.upper:+.1f}] pts")
    return (f"look {look.look + 1}/{len(plan.sizes)} {candidate}/{plan.name}: n = {look.n} of {plan.n_planned}, "
            f"{100 * look.adjusted_level:.2f}% CI {ci} (margin -{100 * plan.policy.margin:.1f} pts): {look.decision}")


def run_sequential(spec: RunSpec, rd: RunDir, data_dir: Path | None, policy: Policy, *,
                   reused: bool = False) -> dict[str, Comparison]:
    """Run the arms in blocks with a look after each (module doc); write each candidate's comparison.json
    (in `qa.run.pipeline.candidate_dir`) with its looks, and return them by candidate."""
    from qa.gate.sequential import look_decision, sequential_task
    from qa.run.pipeline import candidate_dir

    plans = plan_tasks(spec, policy, data_dir)  # refused before any engine starts
    roles = [r for r, a in spec.arms.items() if a.engine != "lmeval" and not (reused and r == "baseline")]
    looks: dict[tuple[str, str], list[SequentialLook]] = {(c, n): [] for c in spec.candidates for n in plans}
    ended: dict[str, dict[str, int]] = {c: {} for c in spec.candidates}  # candidate -> task -> its last look
    records: dict[str, list[SequentialTask]] = {c: [] for c in spec.candidates}
    with serving(spec, rd, roles, data_dir) as workers:
        for name in (t.name for t in spec.tasks if t.name not in plans):  # tasks without looks run whole, once
            for role, worker in workers.items():
                log_event(rd, event="block", arm=role, look=None, **worker.run_block(name, None))
        for k in range(max((len(p.sizes) for p in plans.values()), default=0)):
            for name, plan in plans.items():
                going = [c for c in spec.candidates if name not in ended[c]]
                if k >= len(plan.sizes) or not going:
                    continue
                for role, worker in workers.items():  # the baseline and the rerun while any candidate goes on
                    if role not in spec.candidates or role in going:
                        answer = worker.run_block(name, plan.sizes[: k + 1])
                        log_event(rd, event="block", arm=role, look=k, n=plan.sizes[k], **answer)
            for cand in spec.candidates:
                active = [p for n, p in plans.items() if n not in ended[cand] and k < len(p.sizes)]
                if not active:
                    continue
                comparison = compare_items(spec, rd, cand, {p.name: p.first(p.sizes[k], spec.seed) for p in active})
                for plan in active:
                    est, history = gated(comparison, plan), looks[(cand, plan.name)]
                    if est is not None:
                        history.append(look_decision(est, plan.policy, k, plan.n_planned))
                        print(look_line(cand, plan, history[-1]), flush=True)
                    if k == len(plan.sizes) - 1 or (history and history[-1].decision != "continue"):
                        ended[cand][plan.name] = k
                        if est is not None:
                            records[cand].append(sequential_task(est, plan.policy, history, plan.n_planned))
    out: dict[str, Comparison] = {}
    for cand in spec.candidates:
        keep = {t.name: plans[t.name].first(plans[t.name].sizes[ended[cand][t.name]], spec.seed)
                if t.name in plans else None for t in spec.tasks}
        comparison = compare_items(spec, rd, cand, keep).model_copy(update={"sequential": records[cand]})
        candidate_dir(spec, rd, cand).save_comparison(comparison)
        out[cand] = comparison
    return out
