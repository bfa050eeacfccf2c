"""The KV-scale provenance record of arm.json (`engine_info.kv`): which KV cache and which K/V scales
an engine says it ran with. Plain data, read by the gate and the report; evals.engines.kv_provenance says how
each engine's provenance is found, evals.provenance.server_log reads it off a server's log messages.

`scales_origin` says where the scales came from: calibrated (a scales file), checkpoint (the model
folder's k/v_scale tensors), defaulted (1.0 because nothing provided them), dynamic (computed on
write), constant (a spec's constant_scale), unquantized (a plain KV cache: no scales), unknown.
`scales_convention` says what the numbers are (a quant.scales.conventions name: nvfp4-decode amax/2688,
nvfp4-global amax/6, fp8-decode amax/448, nvfp4-encode 2688/amax), where known: for the emulator the
convention of the decode scales its cache read (a model folder's numbers converted for its format, or the
one a scales file's decode scales are derived in); for vLLM the one its model folder declares (read as they
are). `folder_scales` records how a model folder's scales were read (quant.scales.folder.ScalesReading):
the convention declared, the one fitted on calibration prompts (when `qa run`'s preflight fitted them),
what the format reads, and whether they were taken as they are despite a refusal.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from quant.formats.catalog import cache_bytes_per_token
from quant.scales.conventions import CONVENTIONS, expected_convention, mismatch_factor
from quant.scales.folder import ScalesReading

ProvenanceSource = Literal["hf-emulator", "vllm-offline", "vllm-server", "llamacpp-server"]
ScalesOrigin = Literal["calibrated", "checkpoint", "defaulted", "dynamic", "constant", "unquantized", "unknown"]
STATIC_ORIGINS: frozenset[str] = frozenset({"calibrated", "checkpoint"})  # scales someone measured


class LayerScales(BaseModel):
    """The K and V decode scales one attention layer uses (x ~ stored * scale); one per head or one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layer: int = Field(ge=0)
    format: str  # the layer's KV storage format / dtype ("none": kept unquantized)
    k_scale: list[float]
    v_scale: list[float]
    num_kv_heads: int | None = None  # what the layer caches per token, where the engine said (the qa_kv plugin)
    head_size: int | None = None


class KVProvenance(BaseModel):
    """What an engine says about its KV cache after load (arm.json `engine_info.kv`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: ProvenanceSource
    kv_dtype: str  # the KV cache dtype as the engine resolved it (vLLM "auto": the model dtype, see storage_dtype)
    storage_dtype: str | None = None  # dtype of the allocated KV tensors (vLLM) or the stored codes
    encoding: str | None = None  # how values become stored codes, where measured (e.g. the rounding)
    attention_backend: str | None = None  # the attention backend the engine picked (vLLM: e.g. CPU_ATTN)
    scales_origin: ScalesOrigin
    # the arm was meant to run with measured scales: static emulator scales, a checkpoint that declares
    # KV quantization (vLLM loaded a KV quant method), a server with a quantization config
    scales_expected: bool = False
    scales_sha256: str | None = None  # the calibrated scales file's bytes (calibrated origin)
    constant_scale: float | None = None  # the one decode scale of every layer (constant origin)
    scales_convention: str | None = None  # what the scale numbers are (module docstring), None: not known
    folder_scales: ScalesReading | None = None  # how a model folder's scales were read (module docstring)
    layers: list[LayerScales] = Field(default_factory=list)
    log_lines: list[str] = Field(default_factory=list)  # a server log's lines about KV dtype and scales

    def bytes_per_token(self, model_bytes: int = 2) -> tuple[int, int] | None:
        """(bytes one token takes in the KV cache over every layer in its format, the same unquantized at
        `model_bytes` per element) by the formats' definitions (quant.formats.catalog.kv_bytes_per_token);
        None unless every layer recorded its geometry."""
        if not self.layers or any(s.num_kv_heads is None or s.head_size is None for s in self.layers):
            return None
        return cache_bytes_per_token([(s.format, s.head_size, s.num_kv_heads, None)  # type: ignore[misc]
                                      for s in self.layers], model_bytes)

    @property
    def quantized(self) -> bool:
        """Whether the KV cache stores quantized values (any layer not kept at the model dtype)."""
        return self.scales_origin != "unquantized"

    def all_scales_one(self) -> bool:
        """Every layer's k and v scale is exactly 1.0 (vLLM's default), and there is at least one layer."""
        values = [s for layer in self.layers for s in (*layer.k_scale, *layer.v_scale)]
        return bool(values) and all(v == 1.0 for v in values)

    def nvfp4(self) -> bool:
        """Whether the KV cache (its dtype or any layer's format) is NVFP4."""
        return self.kv_dtype.startswith("nvfp4") or any(s.format.startswith("nvfp4") for s in self.layers)

    def unit_scales(self) -> bool:
        """Whether every scale it ran with is 1.0: all layers' k/v scales, or a constant 1.0."""
        return self.all_scales_one() or self.constant_scale == 1.0

    def convention_mismatch(self) -> str | None:
        """Why the scales' convention is not the one the KV cache reads them in (one clause), None when it
        is, or nothing says (no convention recorded, an unquantized cache)."""
        if self.scales_convention is None or not self.quantized:
            return None
        written = CONVENTIONS.get(self.scales_convention)
        if written is None:
            return f"its K/V scales are in an unknown convention {self.scales_convention!r}"
        formats = sorted({s.format for s in self.layers if s.format != "none"} or {self.kv_dtype})
        for fmt in formats:
            expected = expected_convention(fmt)
            if expected is not None and (factor := mismatch_factor(written, expected)) != 1.0:
                return (f"its {fmt} KV cache reads scales as {expected.name} ({expected.formula}) but they are "
                        f"{written.name} ({written.formula}): decode scales {max(factor, 1 / factor):g}x too "
                        f"{'large' if factor > 1 else 'small'}")
        return None

    def summary(self) -> str:
        """One line: dtype, storage, origin, and the scale range over layers."""
        parts = [f"{self.source}: KV {self.kv_dtype}"]
        if self.storage_dtype:
            parts.append(f"stored as {self.storage_dtype}")
        if self.encoding:
            parts.append(self.encoding)
        if self.attention_backend:
            native = "native " if self.quantized else ""
            parts.append(f"{native}{self.kv_dtype} cache, {self.attention_backend} backend")
        origin = self.scales_origin
        if self.scales_sha256:
            origin += f" (sha256 {self.scales_sha256[:12]})"
        if self.constant_scale is not None:
            origin += f" {self.constant_scale:g}"
        if self.scales_convention is not None:
            origin += f", {self.scales_convention}"
        if (fs := self.folder_scales) is not None:
            origin += (f" (declared {fs.declared}, fitted {fs.fitted or 'none'})" if fs.fit_on is not None
                       else f" (declared {fs.declared}, not fitted)")
        parts.append(f"scales {origin}")
        ks = [s for layer in self.layers for s in layer.k_scale]
        vs = [s for layer in self.layers for s in layer.v_scale]
        if ks and vs:
            parts.append(f"k_scale {min(ks):.4g}..{max(ks):.4g}, v_scale {min(vs):.4g}..{max(vs):.4g} "
                         f"over {len(self.layers)} layers")
        return "; ".join(parts)
