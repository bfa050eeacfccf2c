"""The conventions a checkpoint's per-layer K/V scale is written in, named, fitted and checked (torch-free).

One float per layer and K/V (amax: the largest |x| the scale is meant to cover); four are in circulation:
- nvfp4-decode: `k_scale = amax / (6 * 448) = amax / 2688`, the dequant multiplier of a two-level NVFP4
  value (x ~ e2m1 * e4m3_block * k_scale). What vLLM's NVFP4 KV cache expects: its store kernel takes
  gs = 1 / k_scale and its attention multiplies by k_scale (docs/NVFP4_KV_SCALES.md cites the code);
  also ModelOpt's and torchao's decode scale.
- nvfp4-global: `k_scale = amax / 6`, a "global scale" that maps amax onto E2M1's 6 and leaves the E4M3
  block scales in (0, 1]. 448x what vLLM expects: read by vLLM as a decode scale, every block scale
  becomes amax_block / amax <= 1, subnormal or zero in E4M3.
- fp8-decode: `k_scale = amax / 448`, vLLM's FP8 E4M3 KV scale; 6x the NVFP4 decode scale.
- nvfp4-encode: `k_global_scale = 6 * 448 / amax`, compressed-tensors' tensor_group global scale (what
  llm-compressor stores for NVFP4 KV): the reciprocal of nvfp4-decode.

`fit_convention` says which one a folder's numbers fit, given the amax observed here on the same prompts;
`convention_warnings` turns a misfit into one-line warnings.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

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
        "a global scale mapping amax onto E2M1's 6; vLLM would read it as the decode multiplier (448x too large)"),
    "fp8-decode": Convention(
        "fp8-decode", "amax / 448", F8_E4M3_MAX, False, "fp8_e4m3",
        "FP8 E4M3 decode scale (x ~ fp8 * k_scale)"),
    "nvfp4-encode": Convention(
        "nvfp4-encode", "2688 / amax", F8_E4M3_MAX * F4_E2M1_MAX, True, "nvfp4",
        "compressed-tensors' tensor_group global scale (k_global_scale), the reciprocal of the decode multiplier"),
}
VALUE_CONVENTIONS: tuple[ConventionName, ...] = ("nvfp4-decode", "fp8-decode", "nvfp4-global")  # a k_scale's
# the convention each KV cache dtype (emulator format or vLLM kv_cache_dtype) reads its k_scale in
EXPECTED: dict[str, ConventionName] = {
    "nvfp4": "nvfp4-decode", "nvfp4_4over6": "nvfp4-decode", "fp8": "fp8-decode", "fp8_e4m3": "fp8-decode",
}

# a vLLM model folder's scales (quant.export): format calibrated -> (the convention its decode scales are in,
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


def expected_convention(kv_dtype: str) -> Convention | None:
    """The convention a KV cache of `kv_dtype` reads its scales in (None: no tensor scale convention known)."""
    name = EXPECTED.get(kv_dtype)
    return CONVENTIONS[name] if name is not None else None


def mismatch_factor(written: Convention, expected: Convention) -> float:
    """How many times too large (> 1) or too small (< 1) the decode scale a reader of `expected` derives from
    numbers written in `written` is: 1.0 when they agree (nvfp4-encode agrees with nvfp4-decode)."""
    return expected.decode_per_amax / written.decode_per_amax


@dataclass(frozen=True)
class ConventionFit:
    """Which convention a set of stored numbers fits, given amax observed on the same model."""

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
    return ConventionFit(best if fits else None, ratios[best], ratios)  # type: ignore[arg-type]


def all_ones(stored: Sequence[float]) -> bool:
    """Every stored number is exactly 1.0 (vLLM's uncalibrated default), and there is at least one."""
    return bool(stored) and all(s == 1.0 for s in stored)


def convention_warnings(where: str, stored: Sequence[float], fit: ConventionFit | None, declared: Convention,
                        expected: Convention | None) -> list[str]:
    """One-line warnings: every scale 1.0; numbers off from what the reader expects by a convention factor
    (448: a global scale amax/6 read as vLLM's NVFP4 decode multiplier; 6: FP8 scales read as NVFP4);
    numbers that fit another convention than the folder declares; numbers that fit none."""
    if all_ones(stored):
        return [f"warning: {where}: every K/V scale is 1.0: uncalibrated (vLLM's default), not measured on data"]
    out = []
    found = CONVENTIONS[fit.convention] if fit is not None and fit.convention is not None else None
    if fit is not None and found is None:
        out.append(f"warning: {where}: the scales fit no known convention (closest "
                   f"{min(fit.ratios, key=lambda n: abs(math.log(fit.ratios[n])))}, off by {fit.ratio:.3g}x)")
    if found is not None and found.decode_per_amax != declared.decode_per_amax:
        out.append(f"warning: {where}: declared {declared.name} ({declared.formula}) but the numbers fit "
                   f"{found.name} ({found.formula}), off by {declared.decode_per_amax / found.decode_per_amax:g}x")
    written = found or declared
    if expected is not None:
        factor = mismatch_factor(written, expected)
        if factor != 1.0:
            big = "too large" if factor > 1 else "too small"
            out.append(f"warning: {where}: the scales are {written.name} ({written.formula}) where a "
                       f"{expected.kv_format} KV cache expects {expected.name} ({expected.formula}): "
                       f"off by the factor {max(factor, 1 / factor):g} between conventions ({big})")
    return out
