"""KVScales: calibrated per-layer (or per-head) K/V clip values and decode scales: safetensors + JSON.

Files: `<stem>.safetensors` holds float32 tensors `k_amax`, `v_amax` (the calibrated clip value, i.e.
the amax an observer chose) and `k_scale`, `v_scale` (the decode scales of `meta.format`:
d = amax / (448 * 6) for NVFP4, amax / 448 for FP8 E4M3), each [L] (granularity "tensor") or [L, H]
(granularity "head"). `<stem>.json` is the sidecar (ScalesMeta): observer, data, convention.
Only safetensors is read (never a pickle); NaN, Inf, zero or negative values are rejected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from quant.errors import QuantError
from quant.fileio import atomic_write_bytes, scales_paths
from quant.formats import get_format
from quant.validation import first_error

SCALES_SCHEMA_VERSION = 1
TENSOR_NAMES: tuple[str, ...] = ("k_amax", "v_amax", "k_scale", "v_scale")
Granularity = Literal["tensor", "head"]
Observer = Literal["absmax", "percentile", "mse"]


class CalibrationData(BaseModel):
    """What the scales were observed on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # "wikitext2", "gsm8k", or a file name
    sha256: str  # hash of the token ids actually used (int64 little-endian bytes)
    n_samples: int
    seq_len: int


class ScalesMeta(BaseModel):
    """The JSON sidecar of a scales file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCALES_SCHEMA_VERSION
    format: str  # format whose decode convention k_scale / v_scale follow
    convention: str  # e.g. "decode: d = amax / (448 * 6)"
    observer: Observer
    percentile: float | None = None  # percentile observer only
    mse_clip_k: list[float] | None = None  # mse observer: chosen clip factor per layer (K)
    mse_clip_v: list[float] | None = None
    mse_token_stride: int | None = None  # mse: the error was measured on every k-th token
    granularity: Granularity
    num_layers: int
    num_kv_heads: int
    model: str
    data: CalibrationData
    seed: int


def convention_text(format_name: str) -> str:
    """Human-readable decode convention of `format_name`, derived from the format itself."""
    one = get_format(format_name).decode_scale_from_amax(torch.tensor(1.0))
    return f"decode: d = amax / {float(1.0 / one):g} (x ~ stored * d; encode scale gs = 1/d)"


def _check_values(name: str, t: torch.Tensor) -> None:
    if t.dtype != torch.float32:
        raise QuantError(f"scales tensor {name!r} must be float32, got {t.dtype}")
    if not bool(torch.isfinite(t).all()):
        raise QuantError(f"scales tensor {name!r} holds NaN or Inf; re-run qa calibrate")
    if not bool((t > 0).all()):
        raise QuantError(f"scales tensor {name!r} holds zero or negative values; re-run qa calibrate")


@dataclass(frozen=True)
class KVScales:
    """Calibrated K/V scales for every layer of one model."""

    k_amax: torch.Tensor  # float32 [L] or [L, H]: calibrated clip value
    v_amax: torch.Tensor
    k_scale: torch.Tensor  # float32 [L] or [L, H]: decode scale of meta.format
    v_scale: torch.Tensor
    meta: ScalesMeta

    def __post_init__(self) -> None:
        for name in TENSOR_NAMES:
            _check_values(name, getattr(self, name))
        shapes = {tuple(getattr(self, n).shape) for n in TENSOR_NAMES}
        if len(shapes) != 1:
            raise QuantError(f"scales tensors disagree in shape: {sorted(shapes)}")
        shape = shapes.pop()
        want = (
            (self.meta.num_layers,)
            if self.meta.granularity == "tensor"
            else (self.meta.num_layers, self.meta.num_kv_heads)
        )
        if shape != want:
            raise QuantError(
                f"scales tensors have shape {shape}, the sidecar says {want} ({self.meta.granularity})"
            )

    @property
    def num_layers(self) -> int:
        """Number of layers covered."""
        return self.meta.num_layers

    def amax(self, layer: int, kind: Literal["k", "v"]) -> torch.Tensor:
        """Calibrated amax of `layer` for K or V: shape () (tensor) or [1, H, 1, 1] (head), float32."""
        t = (self.k_amax if kind == "k" else self.v_amax)[layer]
        return t.reshape(1, -1, 1, 1) if t.dim() else t

    def save(self, path: Path) -> tuple[Path, Path]:
        """Write `<stem>.safetensors` and `<stem>.json` atomically; returns both paths."""
        from safetensors.torch import save  # safetensors: only when scales are written

        tensors_path, meta_path = scales_paths(path)
        tensors_path.parent.mkdir(parents=True, exist_ok=True)
        blob = save(
            {n: getattr(self, n).contiguous() for n in TENSOR_NAMES},
            metadata={"format": self.meta.format, "convention": self.meta.convention},
        )
        atomic_write_bytes(tensors_path, blob)
        atomic_write_bytes(meta_path, (json.dumps(self.meta.model_dump(), indent=2) + "\n").encode())
        return tensors_path, meta_path

    @classmethod
    def load(cls, path: Path) -> KVScales:
        """Read a scales file pair; QuantError when missing, malformed or holding invalid values."""
        from safetensors import SafetensorError  # safetensors: only when scales are read
        from safetensors.torch import load  # safetensors: only when scales are read

        tensors_path, meta_path = scales_paths(path)
        for p in (tensors_path, meta_path):
            if not p.is_file():
                raise QuantError(f"scales file {p} not found; create it with `qa calibrate`")
        try:
            meta = ScalesMeta.model_validate_json(meta_path.read_text())
        except ValidationError as exc:
            err = first_error(exc)
            raise QuantError(f"{meta_path}: {err.where}: {err.msg}") from None
        try:
            tensors = load(tensors_path.read_bytes())
        except (SafetensorError, ValueError) as exc:
            raise QuantError(f"{tensors_path}: not a safetensors file ({exc})") from None
        missing = [n for n in TENSOR_NAMES if n not in tensors]
        if missing:
            raise QuantError(f"{tensors_path}: missing tensors {missing}")
        return cls(**{n: tensors[n] for n in TENSOR_NAMES}, meta=meta)
