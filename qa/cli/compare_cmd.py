"""`qa compare BASE CAND --out DIR`: a thin shell over `qa.api.compare`, which writes DIR/comparison.json,
then `qa.api.decide`, whose verdict under --policy (default: the shipped policy) it prints without writing
verdict.json (`qa gate DIR` writes it). BASE and CAND may be record folders, lm-eval --log_samples folders
or Inspect AI logs (qa.compare.arms reads each kind). `qa plan` is qa.cli.plan_cmd."""

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
from qa.files.comparison import Comparison, StatsSettings
from qa.files.verdict import Verdict

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
    base: Annotated[Path, typer.Argument(help="Baseline: records/<arm> folder, lm-eval --output_path (--log_samples) "
                                              "or an Inspect AI log (.eval / .json).")],
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
    verdict = api.decide(comparison, policy, candidate=cand)
    out_console = Console() if Console().is_terminal else Console(width=160)  # pipes and logs: no wrapping
    out_console.print(_table(comparison, verdict))
    for v in verdict.tasks:
        print(f"{v.task}: {v.status}: {v.reason}")
    print(f"{verdict.summary} (policy {verdict.policy.name}; not written: run `qa gate {out}` for verdict.json)")
    print(f"wrote {out / 'comparison.json'}")
