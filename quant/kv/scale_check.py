"""The convention check of a model folder's K/V scales against a model: observe amax here on calibration
prompts (quant.kv.calibrate, absmax per layer), resolve the folder with it (quant.scales.folder.
resolve_folder_scales: declared vs fitted, converted for the format), and say so in one-line warnings."""

from __future__ import annotations

import torch

from quant.kv.calibrate import CalibrationSpec, calibrate
from quant.kv.inspect_report import FolderScalesCheck, LayerScaleFit
from quant.scales.conventions import convention_warnings
from quant.scales.folder import ObservedAmax, ResolvedScales, resolve_folder_scales


def observe_amax(model, prompts: torch.Tensor, on: str, batch_size: int = 4) -> ObservedAmax:
    """Absmax of `model`'s K and V per layer over prompts [n, T] (max over heads); `on` says what they are."""
    spec = CalibrationSpec(format="nvfp4", observer="absmax", granularity="tensor", n_samples=int(prompts.shape[0]),
                           seq_len=int(prompts.shape[1]), batch_size=batch_size)
    here = calibrate(model, prompts, spec, data_name=on, model_name=on)
    return ObservedAmax(k=[float(x) for x in here.k_amax], v=[float(x) for x in here.v_amax], on=on)


def check_resolved(rs: ResolvedScales, observed: ObservedAmax) -> FolderScalesCheck:
    """kv-inspect's record of a folder resolved against `observed` (resolve_folder_scales with it)."""
    fs, fit = rs.scales, rs.fit
    assert fit is not None  # resolved with `observed`
    stored = fs.stored()  # [K layer 0..L-1, V layer 0..L-1], max over heads
    # what a reader that takes the numbers as they are (vLLM) would get; a converting reader has nothing more
    warnings = convention_warnings(str(fs.folder), stored, fit, fs.convention, rs.read_as)
    if rs.read_as is not None and rs.read_as.name != fs.convention.name and not rs.problems:
        warnings.append(f"note: {fs.folder}: the emulated {rs.kv_format} cache reads them converted from "
                        f"{fs.convention.name} ({fs.convention.formula}) to {rs.read_as.name} ({rs.read_as.formula})")
    if rs.problems:
        warnings.append(f"note: {fs.folder}: `qa run` refuses these scales (the warning above) unless the kv "
                        "spec says scales_as_is = true")
    if not fs.vllm_loads:
        warnings.append(f"warning: {fs.folder}: vLLM 0.32 would not load these scales: {fs.vllm_note}")
    n = fs.num_layers
    layers = [LayerScaleFit(layer=i, k_stored=stored[i], v_stored=stored[n + i], k_amax=observed.k[i],
                            v_amax=observed.v[i]) for i in range(n)]
    return FolderScalesCheck(folder=str(fs.folder), fields=list(fs.fields), declared=fs.convention.name,
                             declared_by=fs.declared_by, vllm_loads=fs.vllm_loads, vllm_note=fs.vllm_note,
                             inspected_format=rs.kv_format, expected=rs.read_as.name if rs.read_as else None,
                             fit=fit.convention, fit_ratio=fit.ratio, ratios=fit.ratios, layers=layers,
                             warnings=warnings, reading=rs.reading())


def check_folder_scales(model, prompts: torch.Tensor, folder, kv_format: str, on: str = "kv-inspect prompts",
                        batch_size: int = 4) -> tuple[ResolvedScales, FolderScalesCheck]:
    """Resolve `folder` for a KV cache of `kv_format` against amax of `model`'s K/V on prompts [n, T], taken
    as it is (an inspection reports problems, it does not refuse): the reading and its record."""
    observed = observe_amax(model, prompts, on, batch_size)
    rs = resolve_folder_scales(folder, kv_format, take_as_is=True, observed=observed)
    return rs, check_resolved(rs, observed)
