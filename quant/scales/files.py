"""KVScales: calibrated per-layer (or per-head) K/V clip values and decode scales: safetensors + JSON.

Files: `<stem>.safetensors` holds float32 tensors `k_amax`, `v_amax` (the calibrated clip value, i.e.
the amax an observer chose) and `k_scale`, `v_scale` (the decode scales of `meta.format`:
d = amax / (448 * 6) for NVFP4, amax / 448 for FP8 E4M3), each [L] (granularity "tensor") or [L, H]
(granularity "head"). `<stem>.json` is the sidecar (ScalesMeta): observer, data, convention.
Only safetensors is read (never a pickle); NaN, Inf, zero or negative values are rejected.

`KVScales.load` also takes a model folder with K/V scales (quant.scales.folder: ours, llm-compressor's,
ModelOpt's), read by `resolve_folder_scales` for the KV format that will read them (`kv_format`; the folder's
own format when not given): `k_amax` is the amax each stored number stands for in the convention the folder
declares, `k_scale` the decode scale of that format, and where the format reads a tensor-scale convention
the amax is the one that gives exactly the converted decode scale (amax_for_decode), so a folder already in
the format's convention round-trips to the bit (quant.kv.cache reads a kv spec's scales so: its format,
`scales_as_is`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from quant.errors import QuantError
from quant.fileio import atomic_write_bytes, scales_paths
from quant.formats.registry import get_format
from quant.scales.folder import FolderScales, ResolvedScales, read_folder_scales, resolve_folder_scales
from quant.validation import first_error

SCALES_SCHEMA_VERSION = 1
TENSOR_NAMES: tuple[str, ...] = ("k_amax", "v_amax", "k_scale", "v_scale")
Granularity = Literal["tensor", "head"]
Observer = Literal["absmax", "percentile", "mse"]
EXTERNAL = "external"  # ScalesMeta.observer of scales read from a checkpoint folder: another tool observed them
ULP_SEARCH = 8  # float32 steps searched either side of d * D for an amax whose decode scale is d


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
    observer: Observer | Literal["external"]
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
    def load(cls, path: Path, *, kv_format: str | None = None, take_as_is: bool = False) -> KVScales:
        """Read a scales file pair, or a model folder's K/V scales resolved for `kv_format` (the folder's own
        format when None; `from_resolved`); QuantError when missing, malformed, in an unknown convention,
        refused (quant.scales.folder.resolve_folder_scales, unless `take_as_is`) or holding invalid values."""
        if Path(path).is_dir():
            if kv_format is None:
                kv_format = read_folder_scales(Path(path)).convention.kv_format
            return cls.from_resolved(resolve_folder_scales(Path(path), kv_format, take_as_is=take_as_is))
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

    @classmethod
    def from_resolved(cls, rs: ResolvedScales) -> KVScales:
        """A model folder's scales as `rs` resolved them for its KV format (module docstring)."""
        fs = rs.scales
        fmt = get_format(rs.read_as.kv_format if rs.read_as is not None else fs.convention.kv_format)
        heads = {len(x) for x in (*fs.k, *fs.v)}
        per_head = len(heads) == 1 and heads != {1}
        tensors = {}
        for kind, amax_rows, decode_rows in (("k", rs.k_amax, rs.k_decode), ("v", rs.v_amax, rs.v_decode)):
            rows = decode_rows if decode_rows is not None else amax_rows
            t = torch.tensor([list(x) if per_head else [max(x)] for x in rows], dtype=torch.float64)
            amax = amax_for_decode(t, fmt.decode_scale_from_amax) if decode_rows is not None else t.to(torch.float32)
            amax = amax if per_head else amax[:, 0]  # [L, H] or [L]
            tensors[f"{kind}_amax"] = amax.contiguous()
            tensors[f"{kind}_scale"] = fmt.decode_scale_from_amax(amax).contiguous()
        granularity: Granularity = "head" if per_head else "tensor"
        conv = f"{fs.convention.name}: {fs.convention.formula} ({fs.declared_by})"
        if rs.read_as is not None and rs.read_as.name != fs.convention.name:
            conv += f", read as {rs.read_as.name} ({rs.read_as.formula})"
        same = rs.read_as is not None and rs.read_as.name == fs.convention.name
        meta = (_recorded_meta(fs, fmt.name, granularity) if same else None) or ScalesMeta(
            format=fmt.name, convention=conv, observer=EXTERNAL, granularity=granularity, num_layers=fs.num_layers,
            num_kv_heads=heads.pop() if per_head else 1, model=str(fs.folder),
            data=CalibrationData(name=f"{fs.folder.name} (checkpoint)", sha256=fs.values_sha256(), n_samples=0, seq_len=0),
            seed=0)
        return cls(**tensors, meta=meta)


def _recorded_meta(fs: FolderScales, fmt: str, granularity: Granularity) -> ScalesMeta | None:
    """The calibration record the folder's convention file keeps (quant.scales.export), restated for what the
    folder holds (its format and granularity); None when there is none or it does not fit."""
    if fs.calibration is None:
        return None
    try:
        meta = ScalesMeta.model_validate(fs.calibration)
    except ValidationError:
        return None
    if meta.num_layers != fs.num_layers or granularity != "tensor":
        return None
    return meta.model_copy(update={"format": fmt, "granularity": granularity})


def amax_for_decode(d: torch.Tensor, decode: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """float32 amax whose decode scale `decode(amax)` is `d` exactly where any float32 amax gives it (every
    d computed as amax / D does), else the nearest: searched ULP_SEARCH float32 steps around d * D."""
    d = d.to(torch.float32)
    per_amax = float(1.0 / decode(torch.tensor(1.0)))  # D of d = amax / D
    best = d * per_amax
    err = (decode(best) - d).abs()
    up, down = best.clone(), best.clone()
    for _ in range(ULP_SEARCH):
        if not bool((err > 0).any()):
            break
        up = torch.nextafter(up, torch.full_like(up, math.inf))
        down = torch.nextafter(down, torch.zeros_like(down))
        for cand in (up, down):
            cerr = (decode(cand) - d).abs()
            better = cerr < err
            best, err = torch.where(better, cand, best), torch.where(better, cerr, err)
    return best
