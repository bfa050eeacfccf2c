"""Items (and wall time) to a verdict: sequential looks vs fixed n, side by side on the same records.

    python -m benchmarks.items_to_verdict RUN_DIR [RUN_DIR ...] [--looks 0.25,0.5,0.75,1]
        [--spending obrien_fleming,pocock,confidence_sequence] [--policy PATH]

For every candidate of every run directory (records/<arm>/ of a finished fixed-n `qa run`) and every task:
the fixed-n verdict of the gate on all paired items, then the looks of a sequential policy (the run's
policy with `looks` and `spending` set) replayed over the same records in the seeded item order the
runner uses (the first n_k items at look k are `evals.run.selection.select_items(selection, n_k, seed)`,
n_k from `qa.stats.sequential.look_sizes`): at each look the arms are compared on those items only
(qa.compare.arms.compare_arms) and `qa.gate.sequential.look_decision` decides; the task's sequential verdict
is the gate's (`qa.gate.decide.decide`) on the comparison of the items used, with its looks recorded.

Printed per (case, task, spending): both verdicts, the items each used and their ratio, and the wall-time
share of the sequential run. Wall time is not in the records, so the share is estimated from them: the
share of scored tokens (teacher-forced tasks, whose cost is per token) or of samples (others), both arms
stopping together. The summary gives, per spending, the mean item ratio over the cases whose verdict is
the same both ways, and the look at which each fixed-n FAIL stopped.

The reports committed under reports/ carry no records (README: comparison, verdict and reports only),
so this takes run directories; the README's numbers come from `examples/studies/items_to_verdict.toml`
(the fault study's baseline, two destructive faults, the correct NVFP4 candidate and the A/A control in
one run, at 200 WikiText-2 chunks so that the first look reaches the default policy's min_n); the run folder
is committed in reports/sequential/items_to_verdict/ (no records), this table in
reports/benchmarks/items_to_verdict/:

    QA_DATA_DIR=../shared/data .venv/bin/qa run examples/studies/items_to_verdict.toml --out reports/runs/items_to_verdict
    .venv/bin/python -m benchmarks.items_to_verdict reports/runs/items_to_verdict \
        > reports/benchmarks/items_to_verdict/items_to_verdict.txt
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from evals.records.samples import SampleRecord
from evals.run.selection import select_items
from qa.compare.arms import Arm, compare_arms, load_arm
from qa.errors import USER_ERRORS, QAError
from qa.files.comparison import Comparison, StatsSettings
from qa.files.policy import SPENDING, Policy, TaskPolicy, load_policy
from qa.files.rundir import RunDir
from qa.gate.decide import decide
from qa.gate.rules import select_estimate
from qa.gate.sequential import look_decision, sequential_task
from qa.stats.sequential import Design, look_sizes
from quant.validation import did_you_mean


@dataclass(frozen=True)
class ItemId:
    """What select_items ranks: an item id."""

    item_id: str


@dataclass(frozen=True)
class Case:
    """One candidate of one run: its arms' records and the run's seed and policy."""

    name: str
    baseline: Arm
    candidate: Arm
    seed: int
    policy: Policy


@dataclass(frozen=True)
class Row:
    """One (case, task, spending) line of the table."""

    case: str
    task: str
    metric: str
    spending: str
    fixed: str
    fixed_n: int
    sequential: str
    seq_n: int
    look: int  # 1-based look the sequential run ended at
    looks: int
    time_share: float

    @property
    def ratio(self) -> float:
        """Items of the sequential run / items of the fixed-n run."""
        return self.seq_n / self.fixed_n if self.fixed_n else 1.0


def load_cases(run: Path, policy_path: Path | None) -> list[Case]:
    """Every candidate of a finished run directory, with the baseline's records."""
    rd = RunDir(run)
    if not rd.spec_file.is_file():
        raise QAError(f"{run}: no spec.toml; pass the directory of a finished `qa run`")
    spec = rd.load_spec()
    policy = load_policy(policy_path) if policy_path is not None else rd.recorded_policy()
    base_dir = rd.arm_records("baseline")
    if not base_dir.is_dir():
        raise QAError(f"{run}: no records/baseline/ (a reused baseline: pass the run directory that ran it)")
    baseline = load_arm(base_dir)
    return [Case(f"{spec.name}/{c}", baseline, load_arm(rd.arm_records(c)), spec.seed, policy)
            for c in spec.candidates if rd.arm_records(c).is_dir()]


def only(arm: Arm, task: str, ids: frozenset[str]) -> Arm:
    """The arm's records of `task` whose item is in `ids`."""
    return Arm(label=arm.label, format=arm.format,
               records=tuple(r for r in arm.records if r.task == task and r.item_id in ids))


def cost(records: tuple[SampleRecord, ...], ids: frozenset[str]) -> float:
    """What the records of `ids` cost to produce: scored tokens when every record has them, else samples."""
    mine = [r for r in records if r.item_id in ids]
    if mine and all(r.token_logprobs is not None for r in mine):
        return float(sum(len(r.token_logprobs.target_ids) for r in mine))  # type: ignore[union-attr]
    return float(len(mine))


def sequential_policy(policy: Policy, looks: tuple[float, ...], spending: str) -> Policy:
    """The policy with `looks` and `spending` set in [default] and in every [tasks] entry."""
    def seq(tp: TaskPolicy) -> TaskPolicy:
        return TaskPolicy.model_validate({**tp.model_dump(), "looks": looks, "spending": spending})

    return policy.model_copy(update={"default": seq(policy.default),
                                     "tasks": {t: seq(tp) for t, tp in policy.tasks.items()}})


class Replay:
    """Comparisons of one case on the first n items of a task, computed once per n."""

    def __init__(self, case: Case, settings: StatsSettings) -> None:
        self.case, self.settings = case, settings
        self.cache: dict[tuple[str, int], Comparison] = {}

    def selection(self, task: str) -> tuple[ItemId, ...]:
        """The task's items with records in both arms, in the dataset's order."""
        cand = {r.item_id for r in self.case.candidate.records if r.task == task}
        seen: dict[str, None] = {}
        for r in self.case.baseline.records:
            if r.task == task and r.item_id in cand:
                seen.setdefault(r.item_id)
        return tuple(ItemId(i) for i in seen)

    def first(self, task: str, n: int) -> frozenset[str]:
        """Item ids of the first n items in the seeded order (the runner's)."""
        return frozenset(it.item_id for it in select_items(self.selection(task), n, self.case.seed))

    def comparison(self, task: str, n: int) -> Comparison:
        """The comparison of the arms on the first n items of `task`."""
        if (task, n) not in self.cache:
            ids = self.first(task, n)
            self.cache[(task, n)] = compare_arms(only(self.case.baseline, task, ids),
                                                 only(self.case.candidate, task, ids), self.settings)
        return self.cache[(task, n)]


def replay_task(rp: Replay, task: str, spending: str, looks: tuple[float, ...]) -> Row:
    """Fixed n and sequential verdicts of one task of one case."""
    case = rp.case
    n_planned = len(rp.selection(task))
    fixed = decide(rp.comparison(task, n_planned), case.policy, None).tasks[0]
    seq_policy = sequential_policy(case.policy, looks, spending)
    tp, explicit = seq_policy.for_task(task), task in seq_policy.tasks
    sizes = look_sizes(Design(tp.looks, tp.alpha, tp.spending), n_planned)
    history = []
    for k, n in enumerate(sizes):
        comp = rp.comparison(task, n)
        history.append(look_decision(select_estimate(comp, task, tp, explicit), tp, k, n_planned))
        if history[-1].decision != "continue":
            break
    est = select_estimate(comp, task, tp, explicit)
    seq = sequential_task(est, tp, history, n_planned)
    verdict = decide(comp.model_copy(update={"sequential": [seq]}), seq_policy, None).tasks[0]
    used, everything = rp.first(task, n), rp.first(task, n_planned)
    share = sum(cost(a.records, used) for a in (case.baseline, case.candidate)) / sum(
        cost(a.records, everything) for a in (case.baseline, case.candidate))
    return Row(case.name, task, fixed.metric, spending, fixed.status, fixed.n, verdict.status, seq.items_used,
               len(history), len(sizes), share)


def tasks_of(case: Case) -> list[str]:
    """Tasks whose candidate records cover every baseline item (an arm still running is left out, said so),
    in the baseline's order."""
    def ids(arm: Arm, task: str) -> set[str]:
        return {r.item_id for r in arm.records if r.task == task}

    out = []
    for task in dict.fromkeys(r.task for r in case.baseline.records):
        have, want = ids(case.candidate, task), ids(case.baseline, task)
        if want <= have:
            out.append(task)
        else:
            print(f"skipped {case.name} {task}: the candidate has {len(have & want)} of the baseline's "
                  f"{len(want)} items (still running?)", file=sys.stderr)
    return out


def print_table(rows: list[Row], seconds: float) -> None:
    """The per-case table and the summary, measured numbers only."""
    head = ("case", "task (metric)", "spending", "fixed n", "items", "sequential", "items", "look",
            "items ratio", "time share")
    lines = [head] + [(r.case, f"{r.task} ({r.metric})", r.spending, r.fixed.upper(), str(r.fixed_n),
                       r.sequential.upper(), str(r.seq_n), f"{r.look}/{r.looks}", f"{r.ratio:.2f}",
                       f"{r.time_share:.2f}") for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))
    print()
    for sp in dict.fromkeys(r.spending for r in rows):
        mine = [r for r in rows if r.spending == sp]
        same = [r for r in mine if r.sequential == r.fixed]
        fails = [r for r in mine if r.fixed == "fail"]
        mean = sum(r.ratio for r in same) / len(same) if same else float("nan")
        share = sum(r.time_share for r in same) / len(same) if same else float("nan")
        print(f"{sp}: same verdict in {len(same)} of {len(mine)} cases; over those, mean items ratio {mean:.2f}, "
              f"mean time share {share:.2f}")
        for r in fails:
            print(f"  fixed-n FAIL {r.case} {r.task}: sequential {r.sequential.upper()} at look {r.look} of {r.looks} "
                  f"({r.seq_n} of {r.fixed_n} items)")
        for r in (r for r in mine if r.sequential != r.fixed):
            print(f"  verdict differs {r.case} {r.task}: fixed n {r.fixed.upper()}, sequential {r.sequential.upper()}")
    print(f"\n(replayed in {seconds:.1f} s)")


def parse_looks(text: str) -> tuple[float, ...]:
    """'0.25,0.5,0.75,1' -> (0.25, 0.5, 0.75, 1.0), checked like a policy's looks."""
    try:
        looks = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise QAError(f"--looks {text!r}: write fractions separated by commas, e.g. 0.25,0.5,0.75,1") from None
    try:
        Design(looks, 0.05, "pocock")
    except ValueError as exc:
        raise QAError(f"--looks {text!r}: {exc}; they must also end at 1.0") from None
    return looks


def main(argv: list[str] | None = None) -> int:
    """Replay every case under each spending; print the table; 0 when done, 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.items_to_verdict",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished fixed-n run directories (with records/)")
    parser.add_argument("--looks", default="0.25,0.5,0.75,1", help="information fractions (default 0.25,0.5,0.75,1)")
    parser.add_argument("--spending", default=",".join(SPENDING), help=f"comma-separated, of {', '.join(SPENDING)}")
    parser.add_argument("--policy", type=Path, default=None, help="gate policy (default: each run's own)")
    ns = parser.parse_args(argv)
    try:
        looks = parse_looks(ns.looks)
        spendings = [s.strip() for s in ns.spending.split(",")]
        for s in spendings:
            if s not in SPENDING:
                raise QAError(f"--spending {s!r}: {did_you_mean(s, SPENDING, listing='one of')}")
        t0 = time.perf_counter()
        rows: list[Row] = []
        for run in ns.runs:
            for case in load_cases(run, ns.policy):
                rp = Replay(case, StatsSettings(seed=case.seed, bootstrap_n=0))  # the gate reads no bootstrap
                for task in tasks_of(case):
                    rows.extend(replay_task(rp, task, sp, looks) for sp in spendings)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_table(rows, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
