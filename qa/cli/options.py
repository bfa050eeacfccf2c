"""CLI options and arguments used by more than one command, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from evals.models.named import DEFAULT_MODEL

DataDirOpt = Annotated[
    Path | None, typer.Option("--data-dir", help="Data folder laid out like shared/data (default $QA_DATA_DIR, else the hub).")
]
DataOpt = Annotated[
    str, typer.Option("--data", help="wikitext2 | gsm8k (train) | a .txt or .jsonl file (field 'text').")
]
ModelOpt = Annotated[str, typer.Option("--model", help="Named model, HF folder or hub id.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu | cuda.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="float32 | bfloat16 | float16.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the sample choice.")]
SeqLenOpt = Annotated[int, typer.Option("--seq-len", help="Tokens per sample.")]
FormatOpt = Annotated[str, typer.Option("--format", help="KV format: nvfp4, nvfp4_4over6, fp8_e4m3, int4_per_token_head, qa_mxfp4, ...")]
RunDirArg = Annotated[
    Path, typer.Argument(help="Run directory holding comparison.json (from `qa run` or `qa compare`).")
]
PolicyOpt = Annotated[
    Path | None,
    typer.Option("--policy", help="Gate policy TOML; default: the run's spec.toml policy, else the shipped default."),
]

StrictPlanOpt = Annotated[
    bool, typer.Option("--strict-plan", help="A margin the power plan shows unreachable is an error (exit 2), not a warning.")
]
PlanPriorOpt = Annotated[
    list[str] | None,
    typer.Option("--plan-prior", help="TASK=SD: the sd of the paired difference the power plan assumes for TASK (repeatable)."),
]
PlanFromOpt = Annotated[
    Path | None,
    typer.Option("--plan-from", help="An earlier run directory of the same model: its comparison.json gives the plan's priors."),
]

__all__ = ["DEFAULT_MODEL", "DataDirOpt", "DeviceOpt", "DtypeOpt", "FormatOpt", "ModelOpt", "PlanFromOpt",
           "PlanPriorOpt", "PolicyOpt", "RunDirArg", "SeedOpt", "SeqLenOpt", "StrictPlanOpt"]
