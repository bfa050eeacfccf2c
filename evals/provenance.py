"""KV-scale provenance: which KV cache and which K/V scales an arm's engine really ran with.

Peers' worst KV-cache bugs were scales that silently defaulted to 1.0; vLLM only logs a warning, and
for a checkpoint without a quantization config it logs nothing at all. So every arm records, in
arm.json (`engine_info.kv`), what its engine says after load:

- hf (the emulator): the spec's format per layer, the scales file's sha256 and the decode scale
  each layer uses (computed from the file's calibrated amax for that layer's format);
- vllm offline: vLLM's resolved cache dtype, the dtype of the allocated KV tensors and every
  attention layer's k/v scale (evals.engines.vllm_introspect);
- a vLLM or llama.cpp server `qa run` started: what its log says (evals.server_log).

The record itself (KVProvenance, its `scales_origin`s) is evals.kv_provenance, re-exported here.
"""

from __future__ import annotations

from pathlib import Path

from evals.engines.hf import read_scales
from evals.engines.hf.args import HFEngineArgs
from evals.kv_provenance import (  # noqa: F401 - the models, re-exported: callers import them from here
    STATIC_ORIGINS,
    KVProvenance,
    LayerScales,
    ProvenanceSource,
    ScalesOrigin,
)
from evals.server_log import server_provenance
from quant.fileio import sha256_file
from quant.kv_spec import KVQuantSpec


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
    import torch  # torch: only when a calibrated scales file is read

    from quant.formats import get_format  # torch: the formats are torch code
    from quant.scales import KVScales, scales_paths  # torch: the scales are tensors

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
        return server_provenance(server_log.read_text(encoding="utf-8", errors="replace"))
    return None
