"""kv_inspect.json: the schema of kv-inspect's per-layer numbers (`InspectReport`, versioned by
`schema_version`) and its atomic save and checked load; plain data, no torch, so the report and the gate
read it without loading what computed it (quant.kv.inspect.inspect_kv, which re-exports these names).

An exact reconstruction's SQNR is inf, written as the JSON constant Infinity. `load_inspect(path)`
raises a one-line QuantError naming the path when the file is missing or not a valid report.
`scales_check` (FolderScalesCheck, quant.kv.scale_check) is there when the inspected scales came from a model
folder: the fields found, the convention they declare and the one they fit against amax observed here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from quant.errors import QuantError
from quant.fileio import atomic_write_text
from quant.formats.catalog import cache_bytes_per_token
from quant.kv.spec import KVQuantSpec
from quant.scales.folder import ScalesReading
from quant.validation import first_error

INSPECT_SCHEMA_VERSION = 1


class KindStats(BaseModel):
    """Reconstruction statistics of K or V of one layer, over all prompts."""

    # an exact reconstruction has SQNR inf: written as the JSON constant Infinity (Python's json reads it)
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    sqnr_db: float  # inf when the reconstruction is exact
    rel_error: float
    underflow_share: float
    saturation_share: float
    amax: float


class LayerReport(BaseModel):
    """One layer's numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layer: int
    format: str
    k: KindStats
    v: KindStats
    attn_rel_error: float


class LayerScaleFit(BaseModel):
    """One layer's stored K/V scales (max over heads) next to the amax observed here on the same prompts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layer: int
    k_stored: float
    v_stored: float
    k_amax: float  # absmax of K (after RoPE) over the inspected prompts
    v_amax: float


class FolderScalesCheck(BaseModel):
    """Which convention a model folder's K/V scales are in (quant.scales.conventions), checked against this model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    folder: str
    fields: list[str]  # the K and V fields, layer index as {i}
    declared: str  # the convention the folder declares (a quant.scales.conventions name)
    declared_by: str
    vllm_loads: bool  # whether vLLM 0.32 would load these fields
    vllm_note: str
    inspected_format: str  # the KV format inspected
    expected: str | None  # the convention that format reads its scales in
    fit: str | None  # the convention the numbers fit (None: none within a factor sqrt(6))
    fit_ratio: float  # median stored / (what `fit`, or the closest, would store for the amax observed here)
    ratios: dict[str, float]  # that median for every candidate convention
    layers: list[LayerScaleFit]
    warnings: list[str]  # one line each
    reading: ScalesReading | None = None  # the folder as resolve_folder_scales read it for inspected_format


class InspectReport(BaseModel):
    """kv-inspect result for one model, spec and set of prompts: the schema of kv_inspect.json."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = INSPECT_SCHEMA_VERSION
    model: str  # "" when not named
    spec: KVQuantSpec  # the inspected cache (prefill_reads_quantized is always True here)
    scales: str  # "dynamic", "constant", or the scales file's observer and data
    n_prompts: int
    tokens_per_prompt: int
    layers: list[LayerReport]
    scales_check: FolderScalesCheck | None = None  # scales read from a model folder: their convention
    # what each attention layer caches per token (quant.kv.shape); None in reports written before it was kept
    kv_heads: int | None = None
    k_head_dim: int | None = None
    v_head_dim: int | None = None

    def bytes_per_token(self, model_bytes: int = 2) -> tuple[int, int] | None:
        """(bytes one token takes in the KV cache over every layer in each layer's format, the same with every
        layer unquantized at `model_bytes` per element), by the formats' definitions
        (quant.formats.catalog.kv_bytes_per_token: data, scales, norms, slot padding); None without the geometry."""
        if self.kv_heads is None or self.k_head_dim is None:
            return None
        return cache_bytes_per_token([(layer.format, self.k_head_dim, self.kv_heads, self.v_head_dim)
                                      for layer in self.layers], model_bytes)


def save_inspect(path: Path, report: InspectReport) -> Path:
    """Write `report` as kv_inspect.json at `path` (atomically); returns the path."""
    path = Path(path)
    atomic_write_text(path, report.model_dump_json(indent=2) + "\n")
    return path


def load_inspect(path: Path) -> InspectReport:
    """Read a kv_inspect.json; QuantError (one line, naming the path) when missing or not a valid report."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QuantError(f"{path}: no kv-inspect report there; make one with `qa kv-inspect`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise QuantError(f"{path}: cannot read the kv-inspect report ({type(exc).__name__})") from None
    try:
        return InspectReport.model_validate_json(text)
    except ValidationError as exc:
        err = first_error(exc)
        where = err.where_or("the file")
        raise QuantError(
            f"{path}: not a kv-inspect report (schema {INSPECT_SCHEMA_VERSION}): {where}: {err.msg}"
        ) from None
