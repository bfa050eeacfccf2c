"""The conventions a checkpoint's per-layer K/V scale is written in, named, declared, fitted and checked (torch-free).

One float per layer and K/V (amax: the largest |x| the scale is meant to cover); four are named here, each
with the code that defines it (docs/NVFP4_KV_SCALES.md cites file and function):
- nvfp4-decode: `k_scale = amax / (6 * 448) = amax / 2688`, the dequant multiplier of a two-level NVFP4
  value (x ~ e2m1 * e4m3_block * k_scale). What vLLM's NVFP4 KV cache reads (its store kernel takes
  gs = 1 / k_scale, its attention multiplies by k_scale); what this toolkit's export writes for NVFP4 (with
  kv_scales_convention.json saying so); ModelOpt's and torchao's decode scale.
- nvfp4-global: `k_scale = amax / 6`: compressed-tensors' `calculate_qparams` (scale = amax / (range / 2),
  FP4_E2M1 range [-6, 6]) for a 4-bit float per-tensor scheme, what llm-compressor 0.14 writes for
  `kv_cache_scheme = {num_bits: 4, type: float, strategy: tensor}`. 448x what vLLM's NVFP4 cache reads.
- fp8-decode: `k_scale = amax / 448`: the same `calculate_qparams` for an 8-bit float scheme (FP8_E4M3 range
  [-448, 448]), llm-compressor's FP8 KV folder; vLLM's FP8 decode scale; 6x the NVFP4 decode scale.
- nvfp4-encode: `k_global_scale = 6 * 448 / amax`, compressed-tensors' `generate_gparam` (the global scale of
  a tensor_group scheme): the reciprocal of nvfp4-decode. No writer this toolkit ran stores it for a KV
  cache (llm-compressor 0.14 refuses a tensor_group KV scheme); it stays a hand-built unit case.

`scheme_convention` maps a compressed-tensors kv_cache_scheme onto one as its writer's code defines it;
`fit_convention` says which one a folder's numbers fit, given the amax observed here on calibration
prompts; `convention_problems` names what refuses a folder (all 1.0, declared and fitted disagree) and
`convention_warnings` the same as one-line warnings.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

from quant.errors import QuantError
from quant.validation import did_you_mean

ConventionName = Literal["nvfp4-decode", "nvfp4-global", "fp8-decode", "nvfp4-encode"]
CONVENTION_NAMES: tuple[str, ...] = get_args(ConventionName)
F8_E4M3_MAX = 448.0  # largest finite E4M3 value: the block-scale range of NVFP4, the element range of FP8
F4_E2M1_MAX = 6.0  # largest E2M1 value
# conventions 6x apart (amax/448 vs amax/2688) are told apart halfway in log space: a fit is within sqrt(6)
FIT_FACTOR = math.sqrt(6.0)


@dataclass(frozen=True)
class Convention:
    """How one stored number relates to the amax it covers, and which decode scale it stands for."""

    name: ConventionName
    formula: str  # the stored number, e.g. "amax / 2688"
    per_amax: float  # stored = amax / per_amax, or per_amax / amax when `reciprocal`
    reciprocal: bool  # an encode scale (gs = per_amax / amax) rather than a decode scale
    kv_format: str  # the KV format whose decode scale it is meant as ("nvfp4", "fp8_e4m3")
    meaning: str

    @property
    def decode_per_amax(self) -> float:
        """D of the decode scale d = amax / D this number stands for (the reciprocal's own D)."""
        return self.per_amax

    def stored_from_amax(self, amax: float) -> float:
        """The number a producer of this convention writes for `amax` (float64 arithmetic)."""
        return self.per_amax / amax if self.reciprocal else amax / self.per_amax

    def decode_scale(self, stored: float) -> float:
        """The decode scale vLLM applies for this stored number: the number itself for a k_scale (vLLM
        uses it as is, whatever convention wrote it), 1 / gs for an encode scale (float64)."""
        return 1.0 / stored if self.reciprocal else stored


CONVENTIONS: dict[str, Convention] = {
    "nvfp4-decode": Convention(
        "nvfp4-decode", "amax / 2688", F8_E4M3_MAX * F4_E2M1_MAX, False, "nvfp4",
        "NVFP4 decode multiplier (x ~ e2m1 * e4m3 block scale * k_scale); vLLM stores with gs = 1 / k_scale"),
    "nvfp4-global": Convention(
        "nvfp4-global", "amax / 6", F4_E2M1_MAX, False, "nvfp4",
        "a 4-bit float per-tensor scale (compressed-tensors calculate_qparams, llm-compressor's 4-bit KV scheme) "
        "mapping amax onto E2M1's 6; read by vLLM as the NVFP4 decode multiplier it is 448x too large"),
    "fp8-decode": Convention(
        "fp8-decode", "amax / 448", F8_E4M3_MAX, False, "fp8_e4m3",
        "FP8 E4M3 decode scale (x ~ fp8 * k_scale; compressed-tensors calculate_qparams for 8-bit float)"),
    "nvfp4-encode": Convention(
        "nvfp4-encode", "2688 / amax", F8_E4M3_MAX * F4_E2M1_MAX, True, "nvfp4",
        "compressed-tensors' tensor_group global scale (generate_gparam), the reciprocal of the decode multiplier"),
}
# compressed-tensors' calculate_range for a float scheme: (type, num_bits) -> range / 2 (the largest value),
# so calculate_qparams' symmetric scale amax / (range / 2) is the convention named here
SCHEME_CONVENTIONS: dict[tuple[str, int], ConventionName] = {("float", 8): "fp8-decode", ("float", 4): "nvfp4-global"}
PER_LAYER_STRATEGIES = ("tensor", "attn_head")  # one scale per layer, or per KV head: a k_scale / v_scale field
VALUE_CONVENTIONS: tuple[ConventionName, ...] = ("nvfp4-decode", "fp8-decode", "nvfp4-global")  # a k_scale's
# the convention each KV cache dtype (emulator format or vLLM kv_cache_dtype) reads its k_scale in
EXPECTED: dict[str, ConventionName] = {
    "nvfp4": "nvfp4-decode", "nvfp4_4over6": "nvfp4-decode", "fp8": "fp8-decode", "fp8_e4m3": "fp8-decode",
}

# a vLLM model folder's scales (quant.scales.export): format calibrated -> (the convention its decode scales are in,
# the kv_cache_dtype vLLM runs them with)
VLLM_FOLDER_FORMATS: dict[str, tuple[ConventionName, str]] = {
    "fp8_e4m3": ("fp8-decode", "fp8"), "nvfp4": ("nvfp4-decode", "nvfp4"),
    "nvfp4_4over6": ("nvfp4-decode", "nvfp4_4over6"),
}


def get_convention(name: str) -> Convention:
    """The convention called `name`; QuantError with a did-you-mean for unknown names."""
    conv = CONVENTIONS.get(name)
    if conv is None:
        raise QuantError(f"unknown K/V scale convention {name!r}; {did_you_mean(name, CONVENTION_NAMES, listing='known')}")
    return conv


def scheme_convention(scheme: Mapping[str, Any]) -> ConventionName:
    """The convention of the k_scale / v_scale a compressed-tensors kv_cache_scheme stores, as its writer's
    code defines it (calculate_qparams: amax / (range / 2)); QuantError for a scheme that stores no per-layer
    scale of a known convention (integer, asymmetric, group strategies)."""
    kind, bits, strategy = scheme.get("type"), scheme.get("num_bits"), scheme.get("strategy") or "tensor"
    where = f"kv_cache_scheme num_bits={bits}, type={kind}, strategy={strategy}"
    if scheme.get("symmetric", True) is not True:
        raise QuantError(f"{where}, symmetric=false: an asymmetric K/V scale (with a zero point) has no convention here")
    name = SCHEME_CONVENTIONS.get((str(kind), bits)) if isinstance(bits, int) else None
    if name is None:
        raise QuantError(f"{where}: no per-layer K/V scale convention is known for it (float 8 or 4 bits only)")
    if strategy not in PER_LAYER_STRATEGIES:
        raise QuantError(f"{where}: not a per-layer (tensor) or per-head (attn_head) k_scale / v_scale")
    return name


def expected_convention(kv_dtype: str) -> Convention | None:
    """The convention a KV cache of `kv_dtype` reads its scales in (None: no tensor scale convention known)."""
    name = EXPECTED.get(kv_dtype)
    return CONVENTIONS[name] if name is not None else None


def mismatch_factor(written: Convention, expected: Convention) -> float:
    """How many times too large (> 1) or too small (< 1) the decode scale a reader of `expected` derives from
    numbers written in `written` is: 1.0 when they agree (nvfp4-encode agrees with nvfp4-decode)."""
    return expected.decode_per_amax / written.decode_per_amax


class ConventionFit(BaseModel):
    """Which convention a set of stored numbers fits, given amax observed on the same model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    convention: ConventionName | None  # the best fit, None when none is within FIT_FACTOR
    ratio: float  # for the best: median of stored / stored_from_amax(amax here) (1.0 = exactly that convention)
    ratios: dict[str, float]  # the same median for every candidate convention


def fit_convention(stored: Sequence[float], amax: Sequence[float], *, reciprocal: bool = False) -> ConventionFit:
    """Fit stored numbers (one per layer and K/V) against the amax observed here for the same layers.

    The candidates are the k_scale conventions (VALUE_CONVENTIONS), or nvfp4-encode for an encode field
    (`reciprocal`). Calibration data, observer and clipping differ between tools, so the fit is on the
    median ratio over layers and tolerates a factor FIT_FACTOR either way."""
    if len(stored) != len(amax) or not stored:
        raise QuantError(f"cannot fit {len(stored)} stored scales against {len(amax)} observed amax values")
    names = ("nvfp4-encode",) if reciprocal else VALUE_CONVENTIONS
    pairs = [(s, a) for s, a in zip(stored, amax, strict=True) if a > 0 and s > 0]
    if not pairs:
        raise QuantError("no layer has a positive stored scale and a positive observed amax to compare")
    ratios = {n: statistics.median(s / CONVENTIONS[n].stored_from_amax(a) for s, a in pairs) for n in names}
    best = min(names, key=lambda n: abs(math.log(ratios[n])))
    fits = abs(math.log(ratios[best])) <= math.log(FIT_FACTOR)
    return ConventionFit(convention=best if fits else None, ratio=ratios[best], ratios=ratios)  # type: ignore[arg-type]


def all_ones(stored: Sequence[float]) -> bool:
    """Every stored number is exactly 1.0 (vLLM's uncalibrated default), and there is at least one."""
    return bool(stored) and all(s == 1.0 for s in stored)


def convention_problems(stored: Sequence[float], fit: ConventionFit | None, declared: Convention) -> list[str]:
    """What makes stored numbers unusable as `declared` says, one clause each (no "warning:"): every number
    1.0 (vLLM's uncalibrated default); numbers that fit another convention than declared, named with the
    factor between them (448: amax/6 vs amax/2688; 6: amax/448 vs amax/2688); numbers that fit none."""
    if all_ones(stored):
        return ["every K/V scale is 1.0: uncalibrated (vLLM's default), not measured on data"]
    if fit is None:
        return []
    if fit.convention is None:
        closest = min(fit.ratios, key=lambda n: abs(math.log(fit.ratios[n])))
        return [(f"declared {declared.name} ({declared.formula}) but the scales fit no known convention "
                 f"(closest {closest}, off by {fit.ratio:.3g}x)")]
    found = CONVENTIONS[fit.convention]
    if found.decode_per_amax == declared.decode_per_amax:
        return []
    factor = declared.decode_per_amax / found.decode_per_amax
    return [(f"declared {declared.name} ({declared.formula}) but the numbers fit {found.name} ({found.formula}): "
             f"off by {max(factor, 1 / factor):g}x")]


def convention_warnings(where: str, stored: Sequence[float], fit: ConventionFit | None, declared: Convention,
                        expected: Convention | None) -> list[str]:
    """One-line warnings: `convention_problems`, and, for a reader that takes the numbers as they are (vLLM),
    numbers in another convention than it reads (448: a global scale read as NVFP4's decode multiplier; 6:
    FP8 scales read as NVFP4)."""
    problems = convention_problems(stored, fit, declared)
    out = [f"warning: {where}: {p}" for p in problems]
    if all_ones(stored):
        return out
    written = CONVENTIONS[fit.convention] if fit is not None and fit.convention is not None else declared
    if expected is not None:
        factor = mismatch_factor(written, expected)
        if factor != 1.0:
            big = "too large" if factor > 1 else "too small"
            out.append(f"warning: {where}: the scales are {written.name} ({written.formula}) where a "
                       f"{expected.kv_format} KV cache reading them as they are expects {expected.name} "
                       f"({expected.formula}): off by the factor {max(factor, 1 / factor):g} between conventions "
                       f"({big})")
    return out
