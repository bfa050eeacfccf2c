"""`qa compare BASE CAND --out DIR` and `qa plan --task T --margin M`: thin shells over
`qa.compare.compare` and `qa.planning.plan`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from qa.app import app
from qa.compare import compare as run_compare
from qa.comparison import Comparison, SEBasis, StatsConfig, load_comparison
from qa.errors import QAError
from qa.planning import Plan, plan, plan_from_estimate

MarginOpt = Annotated[float, typer.Option("--margin", help="Non-inferiority margin in score units (0.02 = 2 points).")]
AlphaOpt = Annotated[float, typer.Option("--alpha", help="One-sided level; the decision CI is 1 - 2*alpha.")]


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def _summary(comparison: Comparison) -> Table:
    t = Table(title=f"{comparison.candidate} vs {comparison.baseline} (delta = candidate - baseline)")
    for col in ("task", "metric,filter", "n", "base", "cand", "delta", "90% CI", "method", "non-inf", "sigma rule"):
        t.add_column(col)
    for e in comparison.estimates:
        ci = e.noninferiority.ci
        rule = e.sigma_rule
        t.add_row(
            e.task, f"{e.metric},{e.filter}", str(e.n), _fmt(e.mean_baseline), _fmt(e.mean_candidate),
            _fmt(e.delta, "+.4f"), "-" if ci is None else f"[{ci.lower:+.4f}, {ci.upper:+.4f}]", e.ci_method,
            e.noninferiority.verdict, "-" if rule.passed is None else ("within" if rule.passed else "outside"),
        )
    for d in comparison.distribution:
        t.add_row(d.task, d.metric, f"{d.n_tokens} tok", "", "", _fmt(d.value, "+.5f"),
                  "-" if d.ci95 is None else f"95% [{d.ci95.lower:+.5f}, {d.ci95.upper:+.5f}]", "cluster CR1", "", "")
    return t


@app.command()
def compare(
    base: Annotated[Path, typer.Argument(help="Baseline: records/<arm> folder or lm-eval --output_path (--log_samples).")],
    cand: Annotated[Path, typer.Argument(help="Candidate: same kinds of folder as BASE.")],
    out: Annotated[Path, typer.Option("--out", help="Folder for comparison.json.")],
    margin: MarginOpt = 0.02,
    alpha: AlphaOpt = 0.05,
    k: Annotated[float, typer.Option("--k", help="Sigma-rule multiplier: |delta| <= k * SE.")] = 1.5,
    basis: Annotated[str, typer.Option("--basis", help="Sigma-rule SE: baseline | unpaired | paired.")] = "baseline",
    bootstrap: Annotated[int, typer.Option("--bootstrap", help="Bootstrap resamples (0: off).")] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap generator.")] = 0,
    rerun: Annotated[Path | None, typer.Option("--rerun", help="Optional baseline rerun (same kinds of folder): noise floors.")] = None,
) -> None:
    """Pair two arms item by item and write comparison.json (estimates, tests, distribution checks)."""
    if basis not in ("baseline", "unpaired", "paired"):
        raise QAError(f"--basis {basis!r}: use baseline, unpaired or paired")
    try:
        config = StatsConfig(margin=margin, alpha=alpha, k=k, basis=_basis(basis), bootstrap_n=bootstrap, seed=seed)
    except ValueError as exc:
        raise QAError(f"invalid option: {str(exc).splitlines()[-1].strip()}") from None
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        job = bar.add_task("pairing", total=None)

        def progress(what: str, done: int, total: int) -> None:
            bar.update(job, description=what, completed=done, total=total)

        comparison = run_compare(base, cand, out, config, progress, rerun)
    out_console = Console()
    if not out_console.is_terminal:
        out_console = Console(width=160)  # pipes and logs: no wrapping of the summary table
    out_console.print(_summary(comparison))
    print(f"wrote {out / 'comparison.json'}")


def _basis(name: str) -> SEBasis:
    return name  # type: ignore[return-value]  # checked by the caller


def _plan_table(p: Plan) -> Table:
    t = Table(title=f"{p.task}: drop {p.margin:g}, alpha {p.alpha:g}, power {p.power:g}")
    t.add_column("repeats")
    t.add_column("items needed")
    for row in p.rows:
        t.add_row(str(row.repeats), str(row.items_needed))
    return t


@app.command("plan")
def plan_cmd(
    task: Annotated[str, typer.Option("--task", help="Task name (label; with --from, the task to read).")],
    margin: MarginOpt,
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
        p = plan_from_estimate(ests[0], margin, alpha=alpha, power=power, n_items=n_items)
    else:
        p = plan(task, margin, accuracy=accuracy, rho=rho, alpha=alpha, power=power,
                 within_share=within_share, n_items=n_items)
    console = Console()
    console.print(_plan_table(p))
    console.print(f"sd of paired differences {p.sd_diff:.4f} ({p.source}; accuracy {p.accuracy:.3f}, rho {p.rho:.3f})")
    if p.n_items is not None:
        console.print(f"at n = {p.n_items}: MDE {_fmt(p.mde_at_n)}; repeats needed "
                      f"{p.repeats_needed_at_n if p.repeats_needed_at_n is not None else 'unreachable by repeats alone'}; "
                      f"1.5-sigma rule (baseline SE): false alarm {_fmt(p.sigma_rule_false_alarm, '.3f')}, "
                      f"catches a drop of {_fmt(p.sigma_rule_drop_caught_80)} with 80%")
    for note in p.notes:
        console.print(f"note: {note}")
    sys.stdout.flush()
