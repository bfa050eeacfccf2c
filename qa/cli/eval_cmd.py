"""`qa eval`: run tasks for one arm into `<out>/records/<arm>/`; a thin shell over `evals.run.arm.run_arm`.

Exit 0 when every sample ran (failed samples are recorded, counted and reported, not fatal), 2 for a
usage error. Rerunning the same command resumes; a changed configuration is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from evals.data import resolve_data_dir
from evals.errors import EvalError
from evals.models.named import DEFAULT_MODEL
from evals.run.arm import ArmTask, parse_arm, run_arm
from evals.tasks.base import TaskOptions
from qa.cli.app import app
from qa.cli.options import DataDirOpt, ModelOpt


def _engine_args(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs; VALUE is read as JSON when it parses (numbers, true, lists), else as a string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise EvalError(f"--engine-arg {pair!r}: expected KEY=VALUE, e.g. --engine-arg batch_size=32")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


@app.command("eval")
def eval_command(
    tasks: Annotated[str, typer.Option("--tasks", help="Comma-separated task names, e.g. arc_easy,gsm8k.")],
    arm: Annotated[str, typer.Option("--arm", help="Arm name: the records folder <out>/records/<arm>.")],
    out: Annotated[Path, typer.Option("--out", help="Run directory.")],
    model: ModelOpt = DEFAULT_MODEL,
    engine: Annotated[str, typer.Option("--engine", help="hf | vllm | openai.")] = "hf",
    kv: Annotated[str | None, typer.Option("--kv", help="KV-cache format (hf engine), e.g. nvfp4; default plain.")] = None,
    scales: Annotated[Path | None, typer.Option("--scales", help="Static KV scales file from `qa calibrate`.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Seeded random subset of N items per task.")] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Samples per item (sampled decoding).")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the subset and of per-sample sampling.")] = 0,
    num_fewshot: Annotated[int | None, typer.Option("--num-fewshot", help="Shots (default: lm-eval's).")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", help="Generation budget (default: task's).")] = None,
    temperature: Annotated[float, typer.Option("--temperature", help="> 0: sampled decoding.")] = 0.0,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="Engine batch size.")] = None,
    device: Annotated[str | None, typer.Option("--device", help="hf engine device, e.g. cpu, cuda.")] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help="hf engine dtype: float32 | bfloat16 | float16.")] = None,
    engine_arg: Annotated[list[str] | None, typer.Option("--engine-arg", help="Extra engine argument KEY=VALUE.")] = None,
    data_dir: DataDirOpt = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show progress bars.")] = True,
) -> None:
    """Run tasks for one arm; records go to <out>/records/<arm>/<task>.jsonl (resumable)."""
    args = _engine_args(engine_arg or [])
    for key, value in (("batch_size", batch_size), ("device", device), ("dtype", dtype)):
        if value is not None:
            args[key] = value
    if kv is not None:
        args["kv"] = {"format": kv, **({"scales": "static"} if scales is not None else {})}
    if scales is not None:
        args["scales"] = str(scales)
    config = parse_arm({"name": arm, "model": model, "engine": engine, "engine_args": args, "limit": limit,
                        "repeats": repeats, "seed": seed, "data_dir": resolve_data_dir(data_dir)})
    options = TaskOptions(num_fewshot=num_fewshot, max_tokens=max_tokens, temperature=temperature)
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    summaries = run_arm(config, [ArmTask(n, options) for n in names], out, progress=progress)
    table = Table(title=f"arm {arm}: {out / 'records' / arm}")
    for col in ("task", "items", "samples", "resumed", "written", "errors", "seconds", "samples/s", "gen tok/s"):
        table.add_column(col)
    for s in summaries:
        table.add_row(s.task, str(s.items), str(s.samples), str(s.skipped), str(s.written), str(s.errors),
                      f"{s.seconds:.1f}", f"{s.samples_per_second:.2f}",
                      f"{s.tokens_per_second:.1f}" if s.output_tokens else "-")
    Console().print(table)
    raise typer.Exit(0)
