"""Fault presets for the emulated KV cache, as plain data (torch-free, so a light command lists and
validates them): each reproduces a deployment bug or misconfiguration seen with NVFP4 KV caches, so a
gate can be shown to catch it. `fault_spec(name)` validates a preset into a KVQuantSpec; `base` fields
(e.g. a calibrated `scales_file`) are kept unless the preset sets them. quant.kv.faults holds the hooks
that apply them (and re-exports these names).
"""

from __future__ import annotations

from typing import Any

from quant.errors import QuantError
from quant.kv.spec import KVQuantSpec, kv_spec_from_dict
from quant.validation import did_you_mean

FAULT_PRESETS: dict[str, dict[str, Any]] = {
    # V block-scale bytes read in another order than written (the scale-factor layout/swizzle bug of NVFP4
    # V caches): each token's block scales are applied to the wrong blocks before dequantization.
    "v_scale_layout": {"format": "nvfp4", "v_scale_layout": "reversed"},
    # the same bug where the reader swaps the head and block axes of each token's scales
    "v_scale_transposed": {"format": "nvfp4", "v_scale_layout": "transposed"},
    # no calibration: vLLM's default k_scale = v_scale = 1.0; small activations' block scales underflow
    "uncalibrated_scale_1": {"format": "nvfp4", "scales": "constant", "constant_scale": 1.0},
    # a decode scale 10x too large (e.g. a unit mix-up in export): block scales sink into E4M3 subnormals
    "scale_10x": {"format": "nvfp4", "scale_multiplier": 10.0},
    # NVFP4 on every layer, no high-precision recent window, no skipped layers
    "nvfp4_no_window": {"format": "nvfp4", "recent_window": 0, "skip_layers": ()},
    # random corruption of the codes of 1% of the 16-element blocks (seeded)
    "corrupt_1pct": {"format": "nvfp4", "corrupt_block_fraction": 0.01, "corrupt_seed": 0},
}


def fault_spec(name: str, base: KVQuantSpec | None = None) -> KVQuantSpec:
    """The KVQuantSpec of preset `name` over `base`'s fields; QuantError with a did-you-mean if unknown."""
    preset = FAULT_PRESETS.get(name)
    if preset is None:
        hint = did_you_mean(name, FAULT_PRESETS, listing="choose one of")
        raise QuantError(f"unknown fault preset {name!r}; {hint}")
    fields = base.model_dump(exclude_defaults=True) if base is not None else {}
    if preset.get("scales", "static") != "static":  # a preset that leaves static scales drops the scales file
        fields.pop("scales_file", None)
    return kv_spec_from_dict({**fields, **preset})
