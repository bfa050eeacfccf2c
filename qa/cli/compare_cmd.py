"""`qa compare BASE CAND --out DIR` and `qa plan --task T --margin M`: thin shells over
`qa.api.compare` (+ the gate's verdict under --policy) and `qa.plan.sample_size`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from qa import api
from qa.cli.app import app
from qa.cli.options import PolicyOpt
from qa.files.comparison import Comparison, StatsSettings, load_comparison
from qa.errors import QAError
from qa.files.verdict import Verdict
from qa.plan.sample_size import SampleSizePlan, sample_size_from_estimate, sample_size_plan
from qa.textfmt import pts

AlphaOpt = Annotated[float, typer.Option("--alpha", help="One-sided level; the decision CI is 1 - 2*alpha.")]


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def _table(comparison: Comparison, verdict: Verdict) -> Table:
    t = Table(title=f"{comparison.candidate} vs {comparison.baseline} (delta = candidate - baseline)")
    for col in ("task", "metric,filter", "n", "base", "cand", "delta", "95% CI", "method", "gate"):
        t.add_column(col)
    decided = {(v.task, v.metric): v for v in verdict.tasks}
    for e in comparison.estimates:
        v = decided.get((e.task, f"{e.metric},{e.filter}"))
        t.add_row(e.task, f"{e.metric},{e.filter}", str(e.n), _fmt(e.mean_baseline), _fmt(e.mean_candidate),
                  _fmt(e.delta, "+.4f"), "-" if e.ci95 is None else f"[{e.ci95.lower:+.4f}, {e.ci95.upper:+.4f}]",
                  e.ci_method, "-" if v is None else f"{v.status} ({v.kind})")
    for d in comparison.distribution:
        t.add_row(d.task, d.metric, f"{d.n_tokens} tok", "", "", _fmt(d.value, "+.5f"),
                  "-" if d.ci95 is None else f"[{d.ci95.lower:+.5f}, {d.ci95.upper:+.5f}]", "cluster CR1", "")
    return t


@app.command()
def compare(
    base: Annotated[Path, typer.Argument(help="Baseline: records/<arm> folder or lm-eval --output_path (--log_samples).")],
    cand: Annotated[Path, typer.Argument(help="Candidate: same kinds of folder as BASE.")],
    out: Annotated[Path, typer.Option("--out", help="Folder for comparison.json.")],
    policy: PolicyOpt = None,
    bootstrap: Annotated[int, typer.Option("--bootstrap", help="Bootstrap resamples (0: off).", min=0)] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap generator.")] = 0,
    rerun: Annotated[Path | None, typer.Option("--rerun", help="Optional baseline rerun (same kinds of folder): noise floors.")] = None,
) -> None:
    """Pair two arms item by item, write comparison.json (numbers), print the gate's verdict under --policy."""
    settings = StatsSettings(bootstrap_n=bootstrap, seed=seed)
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        job = bar.add_task("pairing", total=None)

        def progress(what: str, done: int, total: int) -> None:
            bar.update(job, description=what, completed=done, total=total)

        comparison = api.compare(base, cand, out, settings, rerun=rerun, progress=progress)
    verdict = api.decide(comparison, policy)
    out_console = Console() if Console().is_terminal else Console(width=160)  # pipes and logs: no wrapping
    out_console.print(_table(comparison, verdict))
    for v in verdict.tasks:
        print(f"{v.task}: {v.status}: {v.reason}")
    print(f"{verdict.summary} (policy {verdict.policy.name}; not written: run `qa gate {out}` for verdict.json)")
    print(f"wrote {out / 'comparison.json'}")


def _plan_table(p: SampleSizePlan) -> Table:
    t = Table(title=f"{p.task}: drop {p.margin:g}, alpha {p.alpha:g}, power {p.power:g}")
    t.add_column("repeats")
    t.add_column("items needed")
    for row in p.rows:
        t.add_row(str(row.repeats), str(row.items_needed))
    return t


def _check_task(task: str) -> None:
    from evals.tasks import TASKS
    from quant.validation import did_you_mean

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
