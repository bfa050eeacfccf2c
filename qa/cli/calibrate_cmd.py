"""`qa calibrate` (static KV scales, optional export) and `qa kv-inspect` (per-layer KV-cache distortion).

Thin shells over `quant.calibrate.calibrate` and `quant.inspect.inspect_kv`; this module only resolves the
model (evals.models) and the text (evals.data: wikitext2 test, gsm8k train, or a .txt / .jsonl file).
Exit 0 on success, 2 for a usage error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from rich.console import Console
from rich.table import Table

from evals.models import DEFAULT_MODEL, load_model, resolve_model
from qa.run.calibration import calibrate_model, export_vllm_model, load_prompts
from qa.cli.app import app
from qa.cli.options import DataDirOpt, DeviceOpt, DtypeOpt, FormatOpt, ModelOpt, SeedOpt, SeqLenOpt
from qa.report.plots import write_kv_plot
from quant.calibrate import CalibrationSpec
from quant.errors import QuantError
from quant.export import EXPORT_TARGETS, export_scales
from quant.faults import FAULT_PRESETS, fault_spec
from quant.inspect import InspectReport, inspect_kv
from quant.kv_spec import kv_spec_from_dict
from quant.scales import KVScales
from quant.validation import first_error

DataOpt = Annotated[
    str, typer.Option("--data", help="wikitext2 | gsm8k (train) | a .txt or .jsonl file (field 'text').")
]
@app.command("calibrate")
def calibrate_command(
    out: Annotated[
        Path, typer.Option("--out", help="Scales file stem: writes OUT.safetensors and OUT.json.")
    ],
    model: ModelOpt = DEFAULT_MODEL,
    data: DataOpt = "wikitext2",
    fmt: FormatOpt = "nvfp4",
    observer: Annotated[str, typer.Option("--observer", help="absmax | percentile | mse.")] = "absmax",
    percentile: Annotated[
        float, typer.Option("--percentile", help="Percentile of |x| (percentile observer).")
    ] = 99.99,
    granularity: Annotated[str, typer.Option("--granularity", help="tensor | head.")] = "tensor",
    n_samples: Annotated[int, typer.Option("--n-samples", help="Number of samples.")] = 32,
    seq_len: SeqLenOpt = 512,
    seed: SeedOpt = 0,
    export: Annotated[
        str | None, typer.Option("--export", help="Also export: vllm | compressed-tensors.")
    ] = None,
    export_dir: Annotated[
        Path | None, typer.Option("--export-dir", help="Export folder (default: next to OUT).")
    ] = None,
    model_out: Annotated[
        Path | None,
        typer.Option("--model-out", help="With --export vllm: write a model folder vLLM loads with these "
                     "scales (fp8_e4m3 scales; weights hard-linked)."),
    ] = None,
    data_dir: DataDirOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Run the model repository's own code (off by default).")
    ] = False,
) -> None:
    """Observe K (after RoPE) and V per layer on a calibration set and write static KV scales."""
    if export is not None and export not in EXPORT_TARGETS:
        raise QuantError(f"--export {export!r}: choose one of {', '.join(EXPORT_TARGETS)}")
    if model_out is not None and export != "vllm":
        raise QuantError("--model-out writes a vLLM model folder: add --export vllm")
    if model_out is not None and fmt != "fp8_e4m3":
        raise QuantError(f"--model-out: vLLM's fp8 KV cache takes fp8_e4m3 scales, not {fmt!r}; "
                         "add --format fp8_e4m3")
    spec = _calibration_spec(
        format=fmt,
        observer=observer,
        percentile=percentile,
        granularity=granularity,
        n_samples=n_samples,
        seq_len=seq_len,
        seed=seed,
    )
    scales = calibrate_model(model, data, spec, data_dir, device, dtype, trust_remote_code)
    paths = list(scales.save(out))
    if export is not None:
        paths += export_scales(scales, export, export_dir or Path(out).parent)  # type: ignore[arg-type]
    if model_out is not None:
        paths += export_vllm_model(model, scales, model_out)
    table = Table(
        title=f"{model}: {fmt} scales ({observer}, {scales.meta.data.name}, n={scales.meta.data.n_samples})"
    )
    for col in ("layer", "K amax", "K scale", "V amax", "V scale"):
        table.add_column(col, justify="right")
    for i in range(scales.num_layers):
        cells = [scales.k_amax[i], scales.k_scale[i], scales.v_amax[i], scales.v_scale[i]]
        table.add_row(str(i), *(_num(c) for c in cells))
    Console(width=120).print(table)
    for p in paths:
        typer.echo(f"wrote {p}")


def _num(t: torch.Tensor) -> str:
    return f"{float(t.max()):.4g}" if t.numel() > 1 else f"{float(t):.4g}"


def _calibration_spec(**fields: Any) -> CalibrationSpec:
    from pydantic import ValidationError

    try:
        return CalibrationSpec(**fields)
    except ValidationError as exc:
        err = first_error(exc)
        raise QuantError(f"calibrate: --{err.where.replace('.', '-').replace('_', '-')}: {err.msg}") from None


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
