"""KV-scale provenance: which KV cache and which K/V scales an arm's engine really ran with.

Peers' worst KV-cache bugs were scales that silently defaulted to 1.0; vLLM only logs a warning, and
for a checkpoint without a quantization config it logs nothing at all. So every arm records, in
arm.json (`engine_info.kv`), what its engine says after load:

- hf (the emulator): the spec's format per layer, the scales file's sha256 and the decode scale
  each layer uses (computed from the file's calibrated amax for that layer's format);
- vllm offline: vLLM's resolved cache dtype, the dtype of the allocated KV tensors and every
  attention layer's k/v scale (evals.engines.vllm_introspect);
- a vLLM or llama.cpp server `qa run` started: what its log says (evals.server_log).

`scales_origin` says where the scales came from: calibrated (a scales file), checkpoint (the model
folder's k/v_scale tensors), defaulted (1.0 because nothing provided them), dynamic (computed on
write), constant (a spec's constant_scale), unquantized (a plain KV cache: no scales), unknown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from evals.engines.hf.args import HFEngineArgs
from quant.kv_spec import KVQuantSpec

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


class KVProvenance(BaseModel):
    """What an engine says about its KV cache after load (arm.json `engine_info.kv`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: ProvenanceSource
    kv_dtype: str  # the KV cache dtype as the engine resolved it (vLLM "auto": the model dtype, see storage_dtype)
    storage_dtype: str | None = None  # dtype of the allocated KV tensors (vLLM) or the stored codes
    encoding: str | None = None  # how values become stored codes, where measured (e.g. the rounding)
    scales_origin: ScalesOrigin
    # the arm was meant to run with measured scales: static emulator scales, a checkpoint that declares
    # KV quantization (vLLM loaded a KV quant method), a server with a quantization config
    scales_expected: bool = False
    scales_sha256: str | None = None  # the calibrated scales file's bytes (calibrated origin)
    constant_scale: float | None = None  # the one decode scale of every layer (constant origin)
    layers: list[LayerScales] = Field(default_factory=list)
    log_lines: list[str] = Field(default_factory=list)  # a server log's lines about KV dtype and scales

    @property
    def quantized(self) -> bool:
        """Whether the KV cache stores quantized values (any layer not kept at the model dtype)."""
        return self.scales_origin != "unquantized"

    def all_scales_one(self) -> bool:
        """Every layer's k and v scale is exactly 1.0 (vLLM's default), and there is at least one layer."""
        values = [s for layer in self.layers for s in (*layer.k_scale, *layer.v_scale)]
        return bool(values) and all(v == 1.0 for v in values)

    def summary(self) -> str:
        """One line: dtype, storage, origin, and the scale range over layers."""
        parts = [f"{self.source}: KV {self.kv_dtype}"]
        if self.storage_dtype:
            parts.append(f"stored as {self.storage_dtype}")
        if self.encoding:
            parts.append(self.encoding)
        origin = self.scales_origin
        if self.scales_sha256:
            origin += f" (sha256 {self.scales_sha256[:12]})"
        if self.constant_scale is not None:
            origin += f" {self.constant_scale:g}"
        parts.append(f"scales {origin}")
        ks = [s for layer in self.layers for s in layer.k_scale]
        vs = [s for layer in self.layers for s in layer.v_scale]
        if ks and vs:
            parts.append(f"k_scale {min(ks):.4g}..{max(ks):.4g}, v_scale {min(vs):.4g}..{max(vs):.4g} "
                         f"over {len(self.layers)} layers")
        return "; ".join(parts)


def emulator_provenance(args: HFEngineArgs) -> KVProvenance:
    """Provenance of an `hf` arm from its HFEngineArgs: per-layer format and decode scales in effect."""
    kv = args.kv
    if kv is None or (kv.format == "none" and not kv.layer_formats):
        return KVProvenance(source="hf-emulator", kv_dtype=args.dtype, scales_origin="unquantized")
    if kv.scales == "dynamic":
        return KVProvenance(source="hf-emulator", kv_dtype=kv.format, scales_origin="dynamic")
    if kv.scales == "constant":
        assert kv.constant_scale is not None  # the spec validator guarantees it
        return KVProvenance(source="hf-emulator", kv_dtype=kv.format, scales_origin="constant",
                            constant_scale=float(kv.constant_scale))
    return _static_emulator(args, kv)


def _static_emulator(args: HFEngineArgs, kv: KVQuantSpec) -> KVProvenance:
    import torch

    from evals.engines.hf import read_scales
    from quant.fileio import sha256_file
    from quant.formats import get_format
    from quant.scales import KVScales, scales_paths

    named = args.scales or kv.scales_file
    if named is None:  # static scales handed to the cache in code: nothing on disk to name
        return KVProvenance(source="hf-emulator", kv_dtype=kv.format, scales_origin="unknown", scales_expected=True)
    scales = read_scales(args) if args.scales is not None else KVScales.load(named)
    assert scales is not None  # read_scales returns None only when args.scales is None
    layers = []
    for i in range(scales.num_layers):
        fmt = kv.layer_format(i)
        if fmt == "none":
            layers.append(LayerScales(layer=i, format="none", k_scale=[], v_scale=[]))
            continue
        decode = get_format(fmt).decode_scale_from_amax
        k = decode(scales.k_amax[i].to(torch.float32)).reshape(-1).tolist()
        v = decode(scales.v_amax[i].to(torch.float32)).reshape(-1).tolist()
        layers.append(LayerScales(layer=i, format=fmt, k_scale=[float(x) for x in k], v_scale=[float(x) for x in v]))
    return KVProvenance(source="hf-emulator", kv_dtype=kv.format, scales_origin="calibrated", scales_expected=True,
                        scales_sha256=sha256_file(scales_paths(Path(named))[0]), layers=layers)


def engine_provenance(engine: object, args: object, server_log: Path | None) -> KVProvenance | None:
    """Provenance of a built engine: its own `kv_provenance` (vllm), the emulator's arguments (hf), or the
    log of the server started for an openai arm; None when nothing can say (a remote server)."""
    own = getattr(engine, "kv_provenance", None)
    if isinstance(own, KVProvenance):
        return own
    if isinstance(args, HFEngineArgs):
        return emulator_provenance(args)
    if server_log is not None and server_log.is_file():
        from evals.server_log import server_provenance

        return server_provenance(server_log.read_text(encoding="utf-8", errors="replace"))
    return None
