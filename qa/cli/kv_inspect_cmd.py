"""`qa kv-inspect`: per-layer K/V distortion of the emulated KV cache (a thin shell over
`quant.inspect.inspect_kv`). Torch is imported when the command runs, never when the CLI starts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from evals.models import DEFAULT_MODEL, load_model, resolve_model
from qa.cli.app import app
from qa.cli.options import DataDirOpt, DataOpt, DeviceOpt, DtypeOpt, FormatOpt, ModelOpt, SeedOpt, SeqLenOpt
from qa.report.plots import write_kv_plot
from quant.errors import QuantError
from quant.fault_presets import FAULT_PRESETS, fault_spec
from quant.inspect_report import InspectReport
from quant.kv_spec import kv_spec_from_dict


@app.command("kv-inspect")
def kv_inspect_command(
    model: ModelOpt = DEFAULT_MODEL,
    fmt: FormatOpt = "nvfp4",
    scales: Annotated[
        Path | None, typer.Option("--scales", help="Static scales file from `qa calibrate`.")
    ] = None,
    constant_scale: Annotated[
        float | None, typer.Option("--constant-scale", help="One decode scale for all layers (e.g. 1.0).")
    ] = None,
    recent_window: Annotated[
        int, typer.Option("--recent-window", help="Recent positions kept in --recent-format.")
    ] = 0,
    recent_format: Annotated[
        str, typer.Option("--recent-format", help="Format of the recent window.")
    ] = "fp8_e4m3",
    fault: Annotated[
        str | None, typer.Option("--fault", help=f"Fault preset: {', '.join(FAULT_PRESETS)}.")
    ] = None,
    data: DataOpt = "wikitext2",
    n_prompts: Annotated[int, typer.Option("--n-prompts", help="Number of prompts.")] = 4,
    seq_len: SeqLenOpt = 256,
    seed: SeedOpt = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write a PNG: per-layer SQNR bars, K vs V.")
    ] = None,
    data_dir: DataDirOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
) -> None:
    """Per layer: SQNR and relative error of cached K/V, underflowing/saturating blocks, attention error."""
    fields: dict[str, Any] = {"format": fmt, "recent_window": recent_window, "recent_format": recent_format}
    if scales is not None and constant_scale is not None:
        raise QuantError("give --scales or --constant-scale, not both")
    if scales is not None:
        fields.update(scales="static", scales_file=scales)
    elif constant_scale is not None:
        fields.update(scales="constant", constant_scale=constant_scale)
    from qa.pipeline.calibration import load_prompts  # torch: token chunks are tensors
    from quant.inspect import inspect_kv  # torch: the inspection runs the model
    from quant.scales import KVScales  # torch: the scales are tensors

    spec = kv_spec_from_dict(fields)
    if fault is not None:
        spec = fault_spec(fault, spec)
    loaded = KVScales.load(spec.scales_file) if spec.scales == "static" and spec.scales_file else None
    resolved = resolve_model(model)
    hf_model, tokenizer = load_model(resolved, dtype=dtype, device=device)
    _, prompts = load_prompts(tokenizer, data, data_dir, n_prompts, seq_len, seed)
    report = inspect_kv(hf_model, prompts, spec, loaded, model_name=model)
    if plot is not None:
        write_kv_plot(report, plot)
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
    else:
        Console(width=120).print(_inspect_table(report))
    if plot is not None and not as_json:
        typer.echo(f"wrote {plot}")


def _inspect_table(report: InspectReport) -> Table:
    table = Table(
        title=f"{report.model}: {report.spec.format} KV cache, scales {report.scales}, "
        f"{report.n_prompts} x {report.tokens_per_prompt} tokens"
    )
    for col in (
        "layer",
        "fmt",
        "K SQNR dB",
        "V SQNR dB",
        "K rel err",
        "V rel err",
        "underflow K/V",
        "saturated K/V",
        "attn rel err",
    ):
        table.add_column(col, justify="right")
    for r in report.layers:
        table.add_row(
            str(r.layer),
            r.format,
            f"{r.k.sqnr_db:.1f}",
            f"{r.v.sqnr_db:.1f}",
            f"{r.k.rel_error:.4f}",
            f"{r.v.rel_error:.4f}",
            f"{r.k.underflow_share:.2%}/{r.v.underflow_share:.2%}",
            f"{r.k.saturation_share:.2%}/{r.v.saturation_share:.2%}",
            f"{r.attn_rel_error:.4f}",
        )
    return table
