"""`qa kv-inspect`: per-layer K/V distortion of the emulated KV cache (a thin shell over
`quant.kv.inspect.inspect_kv`). Torch is imported when the command runs, never when the CLI starts.

A model folder that carries K/V scales (`--model DIR`, ours, llm-compressor's, ModelOpt's; or `--scales DIR`)
is read by quant.scales.folder.resolve_folder_scales against amax observed here on the same prompts
(`quant.kv.scale_check`), taken as it is (an inspection reports, it does not refuse): the fields found, the
convention declared and the one the numbers fit, and the cache is inspected with the scales converted for
`--format`, as `qa run` would run them; each warning is one line on stderr."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from evals.models.load import load_model
from evals.models.named import DEFAULT_MODEL
from evals.models.resolve import resolve_model
from qa.cli.app import app
from qa.cli.options import DataDirOpt, DataOpt, DeviceOpt, DtypeOpt, FormatOpt, ModelOpt, SeedOpt, SeqLenOpt
from qa.report.plots import write_kv_plot
from quant.errors import QuantError
from quant.kv.fault_presets import FAULT_PRESETS, fault_spec
from quant.kv.inspect_report import FolderScalesCheck, InspectReport
from quant.kv.spec import kv_spec_from_dict
from quant.scales.folder import has_kv_scales


@app.command("kv-inspect")
def kv_inspect_command(
    model: ModelOpt = DEFAULT_MODEL,
    fmt: FormatOpt = "nvfp4",
    scales: Annotated[
        Path | None, typer.Option("--scales", help="Static scales file from `qa calibrate`, or a model folder "
                                  "with K/V scales (default: --model's, when it has some).")
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
    folder = scales if scales is not None and scales.is_dir() else None
    if scales is None and constant_scale is None and Path(model).is_dir() and has_kv_scales(Path(model)):
        folder = Path(model)  # a checkpoint with K/V scales: inspect (and check) the scales it carries
    if folder is not None:  # the folder form of the spec, taken as it is: its problems are reported below
        fields.update(scales=str(folder), scales_as_is=True)
    elif scales is not None:
        fields.update(scales="static", scales_file=scales)
    elif constant_scale is not None:
        fields.update(scales="constant", constant_scale=constant_scale)
    from qa.pipeline.calibration import load_prompts  # torch: token chunks are tensors
    from quant.kv.inspect import inspect_kv  # torch: the inspection runs the model
    from quant.scales.files import KVScales  # torch: the scales are tensors

    spec = kv_spec_from_dict(fields)
    if fault is not None:
        spec = fault_spec(fault, spec)
    # a scales file reads before the model loads; a folder's scales are resolved against the model below
    static_file = spec.scales == "static" and spec.scales_file is not None and folder is None
    loaded = KVScales.load(spec.scales_file) if static_file and spec.scales_file is not None else None
    resolved = resolve_model(model)
    hf_model, tokenizer = load_model(resolved, dtype=dtype, device=device)
    data_name, prompts = load_prompts(tokenizer, data, data_dir, n_prompts, seq_len, seed)
    check = None
    if folder is not None:
        from quant.kv.scale_check import check_folder_scales  # torch: the check observes the model

        on = f"{model} on {data_name}: {prompts.shape[0]} x {prompts.shape[1]} tokens"
        rs, check = check_folder_scales(hf_model, prompts, folder, spec.format, on=on)
        loaded = KVScales.from_resolved(rs)
    report = inspect_kv(hf_model, prompts, spec, loaded, model_name=model)
    if check is not None:
        report = report.model_copy(update={"scales_check": check})
    if plot is not None:
        write_kv_plot(report, plot)
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
    else:
        Console(width=120).print(_inspect_table(report))
        if report.scales_check is not None:
            Console(width=120).print(_scales_table(report.scales_check))
            typer.echo(_scales_summary(report.scales_check))
    if plot is not None and not as_json:
        typer.echo(f"wrote {plot}")
    for line in report.scales_check.warnings if report.scales_check is not None else []:
        typer.echo(line, err=True)



def _scales_summary(check: FolderScalesCheck) -> str:
    """One line: the fields, the convention declared and the one the numbers fit, what vLLM does."""
    fit = (f"fit {check.fit} (median ratio {check.fit_ratio:.4g})" if check.fit
           else f"fit none (closest off by {check.fit_ratio:.3g}x)")
    expected = f"; {check.inspected_format} expects {check.expected}" if check.expected else ""
    return (f"scales of {check.folder}: {' / '.join(check.fields)}; declared {check.declared} ({check.declared_by}); "
            f"{fit}{expected}; vLLM 0.32 loads them: {'yes' if check.vllm_loads else 'no'}")


def _scales_table(check: FolderScalesCheck) -> Table:
    table = Table(title="stored K/V scales (max over heads) and the amax observed here")
    for col in ("layer", "K stored", "K amax here", "V stored", "V amax here"):
        table.add_column(col, justify="right")
    for r in check.layers:
        table.add_row(str(r.layer), f"{r.k_stored:.5g}", f"{r.k_amax:.5g}", f"{r.v_stored:.5g}", f"{r.v_amax:.5g}")
    return table


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
