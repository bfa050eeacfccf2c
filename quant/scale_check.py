"""The convention check of a model folder's K/V scales: observe amax here on the same prompts
(quant.calibrate, absmax per layer), fit the folder's numbers against it (quant.conventions.fit_convention)
and warn, one line each, when they are off by a factor between conventions or are all 1.0."""

from __future__ import annotations

import torch

from quant.calibrate import CalibrationSpec, calibrate
from quant.conventions import convention_warnings, expected_convention, fit_convention
from quant.errors import QuantError
from quant.folder_scales import FolderScales
from quant.inspect_report import FolderScalesCheck, LayerScaleFit


def check_folder_scales(model, prompts: torch.Tensor, fs: FolderScales, kv_format: str,
                        batch_size: int = 4) -> FolderScalesCheck:
    """Check `fs` against amax of `model`'s K/V on prompts [n, T], for a KV cache of `kv_format`."""
    spec = CalibrationSpec(format="nvfp4", observer="absmax", granularity="tensor", n_samples=int(prompts.shape[0]),
                           seq_len=int(prompts.shape[1]), batch_size=batch_size)
    here = calibrate(model, prompts, spec, data_name="kv-inspect prompts", model_name=str(fs.folder))
    if here.num_layers != fs.num_layers:
        raise QuantError(f"{fs.folder}: scales for {fs.num_layers} layers, the model has {here.num_layers}")
    stored = fs.stored()  # [K layer 0..L-1, V layer 0..L-1], max over heads
    amax = [float(x) for x in here.k_amax] + [float(x) for x in here.v_amax]
    fit = fit_convention(stored, amax, reciprocal=fs.convention.reciprocal)
    expected = expected_convention(kv_format)
    warnings = convention_warnings(str(fs.folder), stored, fit, fs.convention, expected)
    if not fs.vllm_loads:
        warnings.append(f"warning: {fs.folder}: vLLM 0.32 would not load these scales: {fs.vllm_note}")
    n = fs.num_layers
    layers = [LayerScaleFit(layer=i, k_stored=stored[i], v_stored=stored[n + i], k_amax=amax[i], v_amax=amax[n + i])
              for i in range(n)]
    return FolderScalesCheck(folder=str(fs.folder), fields=list(fs.fields), declared=fs.convention.name,
                             declared_by=fs.declared_by, vllm_loads=fs.vllm_loads, vllm_note=fs.vllm_note,
                             inspected_format=kv_format, expected=expected.name if expected else None,
                             fit=fit.convention, fit_ratio=fit.ratio, ratios=fit.ratios, layers=layers,
                             warnings=warnings)

