"""An engine's KV-scale provenance: which KV cache and which K/V scales an arm's engine really ran with.

Peers' worst KV-cache bugs were scales that silently defaulted to 1.0; vLLM only logs a warning, and
for a checkpoint without a quantization config it logs nothing at all. So every arm records, in
arm.json (`engine_info.kv`), what its engine says after load:

- hf (the emulator): the spec's format per layer, the scales file's sha256 and the decode scale
  each layer uses (computed from the file's calibrated amax for that layer's format); for scales read
  from a model folder (`kv.scales = "DIR"`), the sha256 of its scale files, the convention its cache read
  them in, and how quant.scales.folder.resolve_folder_scales read them (declared; fitted on the amax `qa
  run`'s preflight observed for this model, evals.provenance.scale_fits; taken as they are or not);
- vllm offline: vLLM's resolved cache dtype, the dtype of the allocated KV tensors and every
  attention layer's k/v scale (evals.engines.vllm.introspect);
- a vLLM or llama.cpp server `qa run` started: what its log says (`server_provenance`: the qa_kv plugin's
  record where the log carries one, else the server's own messages, evals.provenance.server_log).

The record itself (KVProvenance, its `scales_origin`s) is evals.provenance.record. A vLLM
engine's record gets the convention its model folder declares (quant.scales.folder), so a folder of NVFP4
scales run with an fp8 cache shows as a mismatch.
"""

from __future__ import annotations

from pathlib import Path

from evals.engines.hf import read_scales
from evals.engines.hf.args import HFEngineArgs
from evals.engines.vllm.kv.record import emulated_provenance, record_from_log
from evals.provenance.record import KVProvenance, LayerScales
from evals.provenance.scale_fits import load_observed
from evals.provenance.server_log import log_provenance
from quant.errors import QuantError
from quant.fileio import sha256_file
from quant.kv.skip_layers import ModelLayers, config_layers
from quant.kv.spec import KVQuantSpec
from quant.scales.conventions import VLLM_FOLDER_FORMATS
from quant.scales.folder import has_kv_scales, read_folder_scales, resolve_folder_scales


def emulator_provenance(args: HFEngineArgs, model: str | None = None,
                        model_layers: ModelLayers | None = None) -> KVProvenance:
    """Provenance of an `hf` arm from its HFEngineArgs: per-layer format and decode scales in effect (`model`:
    the model's name, whose kept observation fits a model folder's scales; `model_layers`: its layers, which
    skip_layers' attention types and TurboQuant's boundary resolve against)."""
    kv = args.kv
    if kv is None or (kv.format == "none" and not kv.layer_formats):
        return KVProvenance(source="hf-emulator", kv_dtype=args.dtype, scales_origin="unquantized")
    if kv.scales == "dynamic":
        return KVProvenance(source="hf-emulator", kv_dtype=kv.format, scales_origin="dynamic")
    if kv.scales == "constant":
        assert kv.constant_scale is not None  # the spec validator guarantees it
        return KVProvenance(source="hf-emulator", kv_dtype=kv.format, scales_origin="constant",
                            constant_scale=float(kv.constant_scale))
    return _static_emulator(args, kv, model, model_layers)


def _static_emulator(args: HFEngineArgs, kv: KVQuantSpec, model: str | None,
                     model_layers: ModelLayers | None) -> KVProvenance:
    import torch  # torch: only when a calibrated scales file is read

    from quant.formats.registry import get_format  # torch: the formats are torch code
    from quant.scales.files import scales_paths  # torch: the scales module is torch code

    named = args.scales_source
    if named is None:  # static scales handed to the cache in code: nothing on disk to name
        return KVProvenance(source="hf-emulator", kv_dtype=kv.format, scales_origin="unknown", scales_expected=True)
    scales = read_scales(args)
    assert scales is not None  # read_scales reads `named`
    skips = kv.layer_skips(model_layers) if model_layers is not None else None
    layers = []
    for i in range(scales.num_layers):
        fmt = kv.layer_format(i, skips)
        if fmt == "none":
            layers.append(LayerScales(layer=i, format="none", k_scale=[], v_scale=[]))
            continue
        decode = get_format(fmt).decode_scale_from_amax
        k = decode(scales.k_amax[i].to(torch.float32)).reshape(-1).tolist()
        v = decode(scales.v_amax[i].to(torch.float32)).reshape(-1).tolist()
        layers.append(LayerScales(layer=i, format=fmt, k_scale=[float(x) for x in k], v_scale=[float(x) for x in v]))
    reading = None
    if Path(named).is_dir():  # a model folder's scales, read as quant.scales.folder resolves them for kv.format
        folder = read_folder_scales(Path(named))
        observed = load_observed(folder, model) if model is not None else None
        rs = resolve_folder_scales(Path(named), kv.format, take_as_is=True, observed=observed)
        taken = rs.reading().model_copy(update={"taken_as_is": kv.scales_as_is})
        sha, reading = folder.sha256(), taken
        convention = rs.read_as.name if rs.read_as is not None else folder.convention.name
    else:  # a scales file: each layer's decode scale is derived from amax in that layer's own format
        sha = sha256_file(scales_paths(Path(named))[0])
        convention = VLLM_FOLDER_FORMATS[kv.format][0] if kv.format in VLLM_FOLDER_FORMATS else None
    return KVProvenance(source="hf-emulator", kv_dtype=kv.format, scales_origin="calibrated", scales_expected=True,
                        scales_sha256=sha, scales_convention=convention, folder_scales=reading, layers=layers)


def server_provenance(text: str) -> KVProvenance | None:
    """What a vLLM (or llama.cpp) server log says about its KV cache; None when it says nothing. A server
    that ran the qa_kv plugin says what it emulated (evals.engines.vllm.kv.record)."""
    emulated = record_from_log(text)
    if emulated is not None:
        return emulated_provenance(emulated, "vllm-server")
    return log_provenance(text)


def folder_convention(model: object) -> str | None:
    """The convention of the K/V scales a model folder declares (None: not a folder, no scales, unreadable)."""
    if not isinstance(model, str | Path) or not Path(model).is_dir() or not has_kv_scales(Path(model)):
        return None
    try:
        return read_folder_scales(Path(model)).convention.name
    except QuantError:
        return None


def engine_provenance(engine: object, args: object, server_log: Path | None) -> KVProvenance | None:
    """Provenance of a built engine: its own `kv_provenance` (vllm; with the convention its model folder
    declares), the emulator's arguments (hf), or the log of the server started for an openai arm; None
    when nothing can say (a remote server)."""
    own = getattr(engine, "kv_provenance", None)
    if isinstance(own, KVProvenance):
        convention = folder_convention(getattr(getattr(engine, "info", None), "model", None))
        if convention is None or own.scales_convention is not None:  # the engine's own reading says what it ran
            return own
        return own.model_copy(update={"scales_convention": convention})
    if isinstance(args, HFEngineArgs):
        config = getattr(getattr(engine, "model", None), "config", None)  # the hf engine's transformers model
        shape = config_layers(config.get_text_config(decoder=True)) if config is not None else None
        return emulator_provenance(args, getattr(getattr(engine, "info", None), "model", None), shape)
    if server_log is not None and server_log.is_file():
        return server_provenance(server_log.read_text(encoding="utf-8", errors="replace"))
    return None
