"""The K/V scales a model folder carries, read the way vLLM 0.32 would find them, and resolved into what one
KV format reads (torch-free: safetensors headers and the few bytes of the scale tensors, config.json, and the
folder's own convention file).

Fields recognised, per decoder layer i (docs/NVFP4_KV_SCALES.md cites vLLM's remapping of each):
`<prefix>.layers.{i}.self_attn.k_scale` (compressed-tensors / llm-compressor, this toolkit's export),
`...self_attn.k_proj.k_scale` (ModelOpt), `...self_attn.k_proj.output_scale` (vLLM's fp8 config mapper),
`...self_attn.k_global_scale` (compressed-tensors' tensor_group global scale; a hand-built unit case, no
writer run here stores it), and the same for V. A scale is one number per layer or one per KV head (shape
(), [1], [H] or [H, 1, 1]).

What the numbers mean (their convention, quant.scales.conventions) is declared, in this order, by the folder's
`kv_scales_convention.json` (written by quant.scales.export), by a `*_global_scale` field (nvfp4-encode), by a
compressed-tensors kv_cache_scheme mapped as compressed-tensors' calculate_qparams defines it
(quant.scales.conventions.scheme_convention: 8-bit float -> fp8-decode amax/448, 4-bit float -> nvfp4-global amax/6),
or by ModelOpt's kv_cache_quant_algo. A folder with scales and none of these is refused.

`resolve_folder_scales` is the one reading every command uses (the hf engine and the vLLM plugin through
quant.scales.files, `qa run`'s preflight, provenance, `qa kv-inspect`): the declared convention, the fitted one
when amax observed here is given, the problems that refuse the folder (all 1.0; declared and fitted
disagree) unless it is taken as it is, and every layer's amax and decode scale in the format being emulated.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from quant.errors import QuantError
from quant.fileio import scales_paths
from quant.scales.conventions import (
    PER_LAYER_STRATEGIES,
    Convention,
    ConventionFit,
    convention_problems,
    expected_convention,
    fit_convention,
    get_convention,
    scheme_convention,
)

CONVENTION_FILE = "kv_scales_convention.json"
CONVENTION_SCHEMA_VERSION = 1
INDEX_FILE = "model.safetensors.index.json"
MODELOPT_FILE = "hf_quant_config.json"
# <prefix>.layers.<i>.self_attn.<field> with field one of the recognised K/V scale names
FIELD_RE = re.compile(
    r"^(?P<prefix>.*)\.layers\.(?P<layer>\d+)\.self_attn\."
    r"(?P<field>(?P<a>[kv])_scale|(?P<b>[kv])_proj\.(?:[kv]_scale|output_scale)|(?P<c>[kv])_global_scale)$")
STRUCT_CODES = {"F32": ("<f", 4), "F64": ("<d", 8), "F16": ("<e", 2)}  # BF16: the top half of a float32
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on the JSON header


@dataclass(frozen=True)
class FolderScales:
    """The K/V scales of one model folder and what they mean."""

    folder: Path
    fields: tuple[str, str]  # the K and the V field, layer index as {i}: "model.layers.{i}.self_attn.k_scale"
    k: tuple[tuple[float, ...], ...]  # stored numbers per layer: one, or one per KV head
    v: tuple[tuple[float, ...], ...]
    convention: Convention  # what the numbers are (declared, see the module docstring)
    declared_by: str  # which file or rule declared it
    kv_cache_scheme: dict[str, Any] | None  # the quantization config's kv_cache_scheme, if any
    vllm_loads: bool  # whether vLLM 0.32 loads these fields into its attention layers' k/v scales
    vllm_note: str  # how vLLM 0.32 treats them, one line
    files: tuple[Path, ...]  # every file the scales and their meaning were read from (fingerprints, hashes)
    calibration: dict[str, Any] | None  # the convention file's record of the calibration (ScalesMeta JSON)

    @property
    def num_layers(self) -> int:
        """Layers covered."""
        return len(self.k)

    @property
    def per_head(self) -> bool:
        """Whether a layer has one number per KV head (more than one)."""
        return any(len(x) > 1 for x in (*self.k, *self.v))

    def stored(self) -> list[float]:
        """Every stored number, K then V, layer by layer (per-head numbers as their maximum, as vLLM's
        `_k_scale_float` takes them)."""
        return [max(x) for x in self.k] + [max(x) for x in self.v]

    def values_sha256(self) -> str:
        """sha256 of the stored numbers (float64 little-endian, K then V, layer by layer, head by head)."""
        flat = [x for per in (*self.k, *self.v) for x in per]
        return hashlib.sha256(struct.pack(f"<{len(flat)}d", *flat)).hexdigest()

    def sha256(self) -> str:
        """sha256 over the bytes of `files`, in order: the identity of these scales."""
        digest = hashlib.sha256()
        for path in self.files:
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        return digest.hexdigest()


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """(safetensors header, offset of its data) of `path`; QuantError when it is not a safetensors file."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            (size,) = struct.unpack("<Q", raw) if len(raw) == 8 else (-1,)
            if not 0 < size <= MAX_HEADER_BYTES:
                raise ValueError("bad header length")
            header = json.loads(fh.read(size))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise QuantError(f"{path}: not a readable safetensors file ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise QuantError(f"{path}: not a safetensors file (header is not an object)")
    return header, 8 + size


def _values(path: Path, name: str, entry: dict[str, Any], start: int) -> tuple[float, ...]:
    """The float values of tensor `name` (any shape with numel = product of its shape)."""
    dtype, (lo, hi) = entry.get("dtype"), entry.get("data_offsets", (0, 0))
    with open(path, "rb") as fh:
        fh.seek(start + lo)
        raw = fh.read(hi - lo)
    if dtype == "BF16":
        return tuple(struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2))
    if dtype not in STRUCT_CODES:
        raise QuantError(f"{path}: scale {name!r} has dtype {dtype}; expected a float (F32, BF16, F16, F64)")
    code, width = STRUCT_CODES[dtype]
    return tuple(struct.unpack(code, raw[i:i + width])[0] for i in range(0, len(raw), width))


def _weight_files(folder: Path) -> list[Path]:
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        except (OSError, ValueError) as exc:
            raise QuantError(f"{index}: not a readable index ({type(exc).__name__})") from None
        return sorted({folder / name for name in weight_map.values()})
    return sorted(folder.glob("*.safetensors"))


def _found(folder: Path) -> dict[str, dict[int, tuple[tuple[float, ...], Path]]]:
    """{field pattern: {layer: (values, file)}} of every recognised K/V scale tensor in the folder."""
    found: dict[str, dict[int, tuple[tuple[float, ...], Path]]] = {}
    for path in _weight_files(folder):
        if not path.is_file():
            raise QuantError(f"{path}: listed in {INDEX_FILE} but missing")
        header, start = _header(path)
        for name, entry in header.items():
            match = FIELD_RE.match(name) if isinstance(entry, dict) else None
            if match is None:
                continue
            pattern = f"{match['prefix']}.layers.{{i}}.self_attn.{match['field']}"
            found.setdefault(pattern, {})[int(match["layer"])] = (_values(path, name, entry, start), path)
    return found


def has_kv_scales(folder: Path) -> bool:
    """Whether `folder` holds any recognised K/V scale tensor (False for a plain model folder)."""
    try:
        return Path(folder).is_dir() and bool(_found(Path(folder)))
    except QuantError:
        return False


def _kind(pattern: str) -> str:
    field = pattern.rsplit(".self_attn.", 1)[1]
    return field[0]


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise QuantError(f"{path}: not readable JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise QuantError(f"{path}: expected a JSON object")
    return data


def _declared(folder: Path, field: str) -> tuple[str, str, dict[str, Any] | None, bool, str, list[Path]]:
    """(convention name, declared by, kv_cache_scheme, vLLM 0.32 loads them, how, files read)."""
    config_path = folder / "config.json"
    config = _json(config_path) if config_path.is_file() else {}
    qc = config.get("quantization_config") if isinstance(config.get("quantization_config"), dict) else None
    scheme = qc.get("kv_cache_scheme") if qc is not None and isinstance(qc.get("kv_cache_scheme"), dict) else None
    method = str(qc.get("quant_method", "")) if qc is not None else ""
    files = [config_path] if config_path.is_file() else []
    bits = (scheme.get("type"), scheme.get("num_bits")) if scheme is not None else None
    value_field = field.endswith(("k_scale", "v_scale"))
    vllm_kv = bits == ("float", 8) and ((scheme or {}).get("strategy") or "tensor") in PER_LAYER_STRATEGIES
    if method == "compressed-tensors" and vllm_kv:
        loads, how = value_field, (
            "loaded by CompressedTensorsKVCacheMethod into the attention layers' k/v scales, used as they are"
            if value_field else f"{field} is not a name vLLM maps onto the attention layers' scales")
    elif method == "compressed-tensors" and scheme is not None:
        loads, how = False, (f"vLLM 0.32's CompressedTensorsKVCacheMethod refuses a kv_cache_scheme of "
                             f"num_bits={scheme.get('num_bits')}, type={scheme.get('type')}, strategy="
                             f"{scheme.get('strategy')} (NotImplementedError)")
    elif method.startswith("modelopt") or (folder / MODELOPT_FILE).is_file():
        loads, how = value_field, "loaded by ModelOpt's KV cache method into the attention layers' k/v scales"
    else:
        loads, how = False, "no quantization config declares a KV cache scheme: vLLM leaves every scale at 1.0"
    conv_path = folder / CONVENTION_FILE
    if conv_path.is_file():
        data = _json(conv_path)
        name = data.get("convention")
        if not isinstance(name, str):
            raise QuantError(f"{conv_path}: no 'convention' named")
        return name, CONVENTION_FILE, scheme, loads, how, [*files, conv_path]
    if field.endswith("_global_scale"):
        return "nvfp4-encode", f"field {field.rsplit('.', 1)[1]} (compressed-tensors tensor_group)", scheme, \
            loads, how, files
    if method == "compressed-tensors" and scheme is not None:
        try:
            name = scheme_convention(scheme)
        except QuantError as exc:
            raise QuantError(f"{folder}: K/V scales under {exc}") from None
        return name, (f"compressed-tensors kv_cache_scheme num_bits={scheme.get('num_bits')} "
                      f"{scheme.get('type')} {scheme.get('strategy') or 'tensor'} (calculate_qparams: "
                      f"amax / (range / 2))"), scheme, loads, how, files
    algo = _modelopt_kv_algo(folder, qc)
    if algo in ("FP8", "NVFP4"):
        extra = [folder / MODELOPT_FILE] if (folder / MODELOPT_FILE).is_file() else []
        return ("fp8-decode" if algo == "FP8" else "nvfp4-decode"), f"ModelOpt kv_cache_quant_algo={algo}", \
            scheme, loads, how, [*files, *extra]
    raise QuantError(f"{folder}: K/V scales ({field}) in an unknown convention: no {CONVENTION_FILE}, no "
                     "kv_cache_scheme and no ModelOpt kv_cache_quant_algo says what they mean (vLLM would not "
                     "load them: every layer keeps 1.0)")


def _modelopt_kv_algo(folder: Path, qc: dict[str, Any] | None) -> str | None:
    path = folder / MODELOPT_FILE
    section = _json(path).get("quantization", {}) if path.is_file() else (qc or {})
    algo = section.get("kv_cache_quant_algo") if isinstance(section, dict) else None
    return str(algo).upper() if algo else None


def _per_layer(pattern: str, found: dict[int, tuple[tuple[float, ...], Path]],
               layers: int) -> tuple[tuple[float, ...], ...]:
    missing = [i for i in range(layers) if i not in found]
    if missing:
        raise QuantError(f"{pattern}: layers {missing[:8]} have no scale ({len(found)} of {layers} found)")
    out = []
    for i in range(layers):
        values = found[i][0]
        if not values or not all(math.isfinite(x) and x > 0 for x in values):
            raise QuantError(f"{pattern.format(i=i)}: scale {list(values)[:4]} is not positive and finite")
        out.append(values)
    return tuple(out)


def read_folder_scales(folder: Path) -> FolderScales:
    """The K/V scales of a model folder and their convention; QuantError (one line) for a folder without
    scales, with gaps, with several candidate fields, or in an unknown convention."""
    folder = Path(folder)
    if not folder.is_dir():
        raise QuantError(f"{folder}: not a folder")
    found = _found(folder)
    by_kind = {kind: [p for p in found if _kind(p) == kind] for kind in "kv"}
    if not found:
        raise QuantError(f"{folder}: no K/V scales (no *.self_attn.k_scale / k_proj.k_scale / "
                         "k_proj.output_scale / k_global_scale tensor in its safetensors files)")
    for kind, patterns in by_kind.items():
        if len(patterns) != 1:
            what = "no" if not patterns else f"{len(patterns)} candidate"
            raise QuantError(f"{folder}: {what} {kind.upper()} scale fields ({', '.join(sorted(found))})")
    k_field, v_field = by_kind["k"][0], by_kind["v"][0]
    layers = 1 + max(max(found[k_field]), max(found[v_field]))
    k, v = _per_layer(k_field, found[k_field], layers), _per_layer(v_field, found[v_field], layers)
    name, declared_by, scheme, loads, how, files = _declared(folder, k_field)
    conv = get_convention(name)
    if conv.reciprocal != k_field.endswith("_global_scale"):
        raise QuantError(f"{folder}: convention {name!r} does not describe the field {k_field}")
    conv_path = folder / CONVENTION_FILE
    calibration = _json(conv_path).get("calibration") if conv_path.is_file() else None
    weights = sorted({p for d in (found[k_field], found[v_field]) for _, p in d.values()})
    return FolderScales(folder=folder, fields=(k_field, v_field), k=k, v=v, convention=conv, declared_by=declared_by,
                        kv_cache_scheme=scheme, vllm_loads=loads, vllm_note=how, files=(*files, *weights),
                        calibration=calibration if isinstance(calibration, dict) else None)


def scales_files(path: Path) -> list[Path]:
    """The files a scales argument's bytes live in: a scales file pair (`<stem>.safetensors`, `<stem>.json`),
    or a model folder's scale-bearing files (config, convention file, the safetensors holding the scales);
    [] when there is nothing readable (the argument is checked where it is used)."""
    path = Path(path)
    if path.is_dir():
        try:
            return list(read_folder_scales(path).files)
        except QuantError:
            return []
    return [p for p in scales_paths(path) if p.is_file()]


class ObservedAmax(BaseModel):
    """amax per layer observed here (quant.kv.scale_check.observe_amax): what a folder's numbers are fitted against."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    k: list[float]  # per layer, max over heads
    v: list[float]
    on: str  # what was observed, e.g. "smollm2-135m on wikitext2: 4 x 128 tokens"


class ScalesReading(BaseModel):
    """How a folder's K/V scales were read (arm.json `engine_info.kv.folder_scales`, kv-inspect's check)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    folder: str
    declared: str  # the convention the folder declares (quant.scales.conventions name)
    declared_by: str
    fitted: str | None = None  # the convention the numbers fit against amax observed here (None: none fits)
    fit_ratio: float | None = None  # median stored / what `fitted` (or the closest) stores for that amax
    fit_on: str | None = None  # what the fit observed; None: no fit was run
    read_as: str | None  # the convention the emulated format reads (the converted decode scales'); None: none
    kv_format: str
    taken_as_is: bool = False  # the spec said scales_as_is = true
    problems: list[str] = Field(default_factory=list)  # what refuses the folder (kept when taken as it is)


@dataclass(frozen=True)
class ResolvedScales:
    """A folder's K/V scales as one KV format reads them (resolve_folder_scales)."""

    scales: FolderScales
    kv_format: str
    read_as: Convention | None  # the convention kv_format reads its scales in (None: a format without one)
    fit: ConventionFit | None
    fit_on: str | None
    k_amax: tuple[tuple[float, ...], ...]  # per layer (per head): the amax each stored number stands for
    v_amax: tuple[tuple[float, ...], ...]
    k_decode: tuple[tuple[float, ...], ...] | None  # the decode scales kv_format reads (None: read_as is None)
    v_decode: tuple[tuple[float, ...], ...] | None
    problems: tuple[str, ...]
    taken_as_is: bool

    @property
    def declared(self) -> Convention:
        """The convention the folder declares."""
        return self.scales.convention

    def sha256(self) -> str:
        """sha256 of the files the scales and their meaning were read from (FolderScales.sha256)."""
        return self.scales.sha256()

    def reading(self) -> ScalesReading:
        """The record of this reading (provenance, kv-inspect)."""
        fit = self.fit
        return ScalesReading(folder=str(self.scales.folder), declared=self.declared.name,
                             declared_by=self.scales.declared_by, fitted=fit.convention if fit else None,
                             fit_ratio=fit.ratio if fit else None, fit_on=self.fit_on if fit else None,
                             read_as=self.read_as.name if self.read_as else None, kv_format=self.kv_format,
                             taken_as_is=self.taken_as_is, problems=list(self.problems))


def _amax(stored: tuple[tuple[float, ...], ...], conv: Convention) -> tuple[tuple[float, ...], ...]:
    """The amax each stored number stands for under `conv` (float64: amax = stored * D, or D / gs)."""
    return tuple(tuple(conv.per_amax / x if conv.reciprocal else x * conv.per_amax for x in per) for per in stored)


def _decode(stored: tuple[tuple[float, ...], ...], amax: tuple[tuple[float, ...], ...], declared: Convention,
            read_as: Convention) -> tuple[tuple[float, ...], ...]:
    """The decode scales `read_as` reads: the stored numbers themselves when they are already in it (bit for
    bit), else amax / D of `read_as`."""
    if declared.name == read_as.name:
        return stored
    return tuple(tuple(a / read_as.per_amax for a in per) for per in amax)


def resolve_folder_scales(folder: Path, kv_format: str, *, take_as_is: bool = False,
                          observed: ObservedAmax | None = None) -> ResolvedScales:
    """Read `folder`'s K/V scales for a KV cache of `kv_format`: the declared convention, the fit against
    `observed` amax (when given), and every layer's amax and decode scale in `kv_format`. QuantError (one
    line, naming the fix) when the folder is unreadable, or when the numbers are all 1.0 or fit another
    convention than declared, unless `take_as_is` (then the problems are kept in the result)."""
    fs = read_folder_scales(Path(folder))
    stored = fs.stored()
    fit = None
    if observed is not None:
        if len(observed.k) != fs.num_layers or len(observed.v) != fs.num_layers:
            raise QuantError(f"{fs.folder}: scales for {fs.num_layers} layers, the model observed has "
                             f"{len(observed.k)}")
        fit = fit_convention(stored, [*observed.k, *observed.v], reciprocal=fs.convention.reciprocal)
    problems = tuple(convention_problems(stored, fit, fs.convention))
    if problems and not take_as_is:
        on = f" (fit on {observed.on})" if observed is not None else ""
        raise QuantError(f"{fs.folder}: K/V scales refused: {problems[0]}{on}; fix the folder, or set "
                         "scales_as_is = true in the kv spec to run them as declared")
    read_as = expected_convention(kv_format)
    k_amax, v_amax = _amax(fs.k, fs.convention), _amax(fs.v, fs.convention)
    k_dec = _decode(fs.k, k_amax, fs.convention, read_as) if read_as is not None else None
    v_dec = _decode(fs.v, v_amax, fs.convention, read_as) if read_as is not None else None
    return ResolvedScales(scales=fs, kv_format=kv_format, read_as=read_as, fit=fit,
                          fit_on=observed.on if observed is not None else None, k_amax=k_amax, v_amax=v_amax,
                          k_decode=k_dec, v_decode=v_dec, problems=problems, taken_as_is=take_as_is)
