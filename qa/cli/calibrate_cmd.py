"""`qa calibrate`: static KV scales (a thin shell over `qa.pipeline.calibration.calibrate_model`, which
resolves the model and reads the text: wikitext2 test, gsm8k train, or a .txt / .jsonl file), written as a
scales file pair (OUT.safetensors + OUT.json), optionally also in another tool's layout (`--export vllm |
compressed-tensors`, quant.scales.export.export_scales) and, with `--export vllm`, as a model folder vLLM
loads (`--model-out`, qa.pipeline.calibration.export_vllm_model). Torch is imported when the command runs,
never when the CLI starts (`qa gate` and the other light commands must not load it).
Exit 0 on success, 2 for a usage error.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from evals.models.named import DEFAULT_MODEL
from qa.cli.app import app
from qa.cli.options import DataDirOpt, DataOpt, DeviceOpt, DtypeOpt, FormatOpt, ModelOpt, SeedOpt, SeqLenOpt
from quant.errors import QuantError
from quant.formats.catalog import EXPORT_TARGETS, check_format_name
from quant.scales.conventions import CONVENTIONS, VLLM_FOLDER_FORMATS
from quant.validation import first_error

if TYPE_CHECKING:
    import torch

    from quant.kv.calibrate import CalibrationSpec
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
                     "scales (fp8_e4m3 or nvfp4; weights and tokenizer hard-linked, the scales' convention in "
                     "kv_scales_convention.json; run NVFP4 with --kv-cache-dtype nvfp4)."),
    ] = None,
    data_dir: DataDirOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Run the model repository's own code (off by default).")
    ] = False,
) -> None:
    """Observe K (after RoPE) and V per layer on a calibration set and write static KV scales."""
    check_format_name(fmt, profile_formats=False)  # as `qa run` checks a calibration, before the model loads
    if export is not None and export not in EXPORT_TARGETS:
        raise QuantError(f"--export {export!r}: choose one of {', '.join(EXPORT_TARGETS)}")
    if model_out is not None and export != "vllm":
        raise QuantError("--model-out writes a vLLM model folder: add --export vllm")
    if model_out is not None and fmt not in VLLM_FOLDER_FORMATS:
        raise QuantError(f"--model-out: a vLLM model folder takes {', '.join(VLLM_FOLDER_FORMATS)} scales, not "
                         f"{fmt!r}; add --format fp8_e4m3 or --format nvfp4")
    from qa.pipeline.calibration import (  # torch: calibration runs the model
        calibrate_model,
        export_vllm_model,
    )
    from quant.scales.export import export_scales  # torch: the scales are tensors

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
    if model_out is not None:
        conv, kv_dtype = VLLM_FOLDER_FORMATS[fmt]
        typer.echo(f"{model_out}: k/v_scale in convention {conv} ({CONVENTIONS[conv].formula}); "
                   f"serve it with --kv-cache-dtype {kv_dtype}")


def _num(t: torch.Tensor) -> str:
    return f"{float(t.max()):.4g}" if t.numel() > 1 else f"{float(t):.4g}"


def _calibration_spec(**fields: Any) -> CalibrationSpec:
    from quant.kv.calibrate import CalibrationSpec  # torch: the observers are torch code

    try:
        return CalibrationSpec(**fields)
    except ValidationError as exc:
        err = first_error(exc)
        raise QuantError(f"calibrate: --{err.where.replace('.', '-').replace('_', '-')}: {err.msg}") from None
