"""`qa plan --task T --margin M`: a thin shell over `qa.plan.sample_size` (items and repeats a paired
non-inferiority test needs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from evals.tasks import TASKS
from qa.cli.app import app
from qa.errors import QAError
from qa.files.comparison import load_comparison
from qa.plan.sample_size import SampleSizePlan, sample_size_from_estimate, sample_size_plan
from qa.textfmt import pts
from quant.validation import did_you_mean

AlphaOpt = Annotated[float, typer.Option("--alpha", help="One-sided level; the decision CI is 1 - 2*alpha.")]


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def _plan_table(p: SampleSizePlan) -> Table:
    t = Table(title=f"{p.task}: drop {p.margin:g}, alpha {p.alpha:g}, power {p.power:g}")
    t.add_column("repeats")
    t.add_column("items needed")
    for row in p.rows:
        t.add_row(str(row.repeats), str(row.items_needed))
    return t


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise QAError(f"--task {task!r}: unknown task; {did_you_mean(task, TASKS, listing='known tasks')}")


@app.command("plan")
def plan_cmd(
    task: Annotated[str, typer.Option("--task", help="Task name (with --from, the task to read).")],
    margin: Annotated[float, typer.Option("--margin", help="Non-inferiority margin in score units (0.02 = 2 points).")],
    rho: Annotated[float, typer.Option("--rho", help="Paired correlation of the arms' item scores.")] = 0.5,
    accuracy: Annotated[float, typer.Option("--accuracy", help="Expected baseline accuracy (0.5: worst case).")] = 0.5,
    alpha: AlphaOpt = 0.05,
    power: Annotated[float, typer.Option("--power", help="Probability of detecting a drop of MARGIN.")] = 0.8,
    within_share: Annotated[float, typer.Option("--within-share", help="Share of Var(d) that is sampling noise (0: greedy).")] = 0.0,
    n_items: Annotated[int | None, typer.Option("--n-items", help="Items the task has (adds MDE and repeats at that n).")] = None,
    from_: Annotated[Path | None, typer.Option("--from", help="A pilot comparison.json: use its sd of differences and rho.")] = None,
) -> None:
    """Items and repeats a paired non-inferiority test needs to detect a drop of MARGIN."""
    checks = [(0 < margin < 1, "--margin must be in (0, 1)"), (-1 <= rho < 1, "--rho must be in [-1, 1)"),
              (0 <= accuracy <= 1, "--accuracy must be in [0, 1]"), (0 < alpha < 0.5, "--alpha must be in (0, 0.5)"),
              (0 < power < 1, "--power must be in (0, 1)"), (0 <= within_share <= 1, "--within-share must be in [0, 1]"),
              (n_items is None or n_items > 1, "--n-items must be > 1")]
    for ok, msg in checks:
        if not ok:
            raise QAError(msg)
    if from_ is not None:
        comparison = load_comparison(from_)
        ests = [e for e in comparison.estimates if e.task == task and e.sd_diff is not None]
        if not ests:
            have = sorted({e.task for e in comparison.estimates})
            raise QAError(f"--from {from_}: no usable estimate for task {task!r} (tasks: {', '.join(have[:6])})")
        p = sample_size_from_estimate(ests[0], margin, alpha=alpha, power=power, n_items=n_items)
    else:
        _check_task(task)
        p = sample_size_plan(task, margin, accuracy=accuracy, rho=rho, alpha=alpha, power=power,
                             within_share=within_share, n_items=n_items)
    console = Console()
    console.print(_plan_table(p))
    console.print(f"sd of paired differences {p.sd_diff:.4f} ({p.source}; accuracy {p.accuracy:.3f}, rho {p.rho:.3f})")
    if p.n_items is not None:
        reps = p.repeats_needed_at_n if p.repeats_needed_at_n is not None else "unreachable by repeats alone"
        console.print(f"at n = {p.n_items}: MDE {pts(p.mde_at_n, signed=False)}; repeats needed {reps}; "
                      f"1.5-sigma rule (baseline SE): false alarm {_fmt(p.sigma_rule_false_alarm, '.3f')}, "
                      f"catches a drop of {pts(p.sigma_rule_drop_caught_80, signed=False)} with 80%")
    for note in p.notes:
        console.print(f"note: {note}")
