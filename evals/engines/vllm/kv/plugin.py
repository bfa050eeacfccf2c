"""The vLLM side of the qa_kv plugin: the `vllm.general_plugins` entry point and what it installs.

`register()` runs in every vLLM process (vllm/plugins/__init__.py load_general_plugins: the API server,
the engine core, every worker). With `QA_VLLM_KV` unset it does nothing. Otherwise it wraps
`base_loader.process_weights_after_loading` (vLLM 0.32 model_loader/base_loader.py), the name
`BaseModelLoader.load_model` calls once the weights are in. Of vLLM 0.32's loaders, those that inherit that
`load_model` go through it: the default loader (load formats auto, hf, safetensors, pt, npcache, mistral,
fastsafetensors, instanttensor), dummy, runai_streamer, sharded_state and runai_streamer_sharded, and
ipc_cache when it falls back to the default loader. The others do not: tensorizer (tensorizer_loader.py)
never calls it, ipc_cache's daemon path calls its own import of utils.process_weights_after_loading,
modelexpress delegates to an external package's loader; a loader added with register_model_loader goes
through it only if it inherits that `load_model`. Where it is not called the plugin installs nothing and
writes no record, so the arm is refused (evals.engines.vllm.kv.record.checked_record), not run unemulated.
After each load that calls it:

- every attention layer is classified: vLLM's `Attention` (MHA/GQA/MQA) and `MLAAttention` are handled;
  a layer that shares another's KV cache (`kv_sharing_target_layer_name`), a non-decoder layer and any
  other attention class (a model's own, Mamba / linear attention) refuse the model in one line (vision
  encoders' MMEncoderAttention keep no KV cache and are left alone);
- each handled layer gets its K/V rewrite (evals.engines.vllm.kv.emulate) installed on that instance only:
  `Attention`: on its backend's cache write `impl.do_kv_cache_update` (vLLM's decoder backends read every
  token, fresh ones included, back from the cache: cpu_attn.py forward -> cpu_attention_with_kv_cache;
  a backend whose forward writes the cache itself gets it on `impl.forward`'s key and value);
  `MLAAttention`: on its backend's cache write `impl.do_kv_cache_update` (kv_c and k_pe as the cache stores
  them) and on `forward_impl` (its prefill attends over the fresh kv_c directly);
- the layers are counted and recorded (evals.engines.vllm.kv.record): a file in `QA_VLLM_KV_RECORD`
  and one log line.
Nothing of vLLM's compiled graph changes: the rewrites run inside vLLM's own opaque attention ops.
This is the only module that imports vllm (inside functions: vLLM loads plugins while importing itself).
"""

from __future__ import annotations

import functools
import logging
import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from evals.engines.vllm.kv.record import PluginRecord, RewrittenLayer, write_record
from evals.engines.vllm.kv.spec import PLUGIN_NAME, RECORD_ENV, describe, spec_from_env

log = logging.getLogger("vllm.qa_kv")  # vLLM's handlers: the line reaches a server's log
WRAPPED = "_qa_kv_wrapped"  # marks the wrapped loader function (register is idempotent)
NO_KV_CACHE = frozenset({"MMEncoderAttention"})  # attention classes that keep no KV cache


class KVPluginRefusal(RuntimeError):
    """The loaded model has an attention layer the plugin cannot rewrite (the message says which)."""


def register() -> None:
    """The entry point: with QA_VLLM_KV set, check the spec and hook model loading (idempotent)."""
    if spec_from_env(os.environ) is None:  # EngineError (a one-line refusal) for a spec vLLM cannot run
        return
    from vllm.model_executor.model_loader import base_loader  # vllm: the plugin runs inside vLLM

    original = base_loader.process_weights_after_loading
    if getattr(original, WRAPPED, False):
        return

    @functools.wraps(original)
    def after_loading(model: Any, model_config: Any, target_device: Any) -> Any:
        out = original(model, model_config, target_device)
        install(model, model_config, target_device)
        return out

    setattr(after_loading, WRAPPED, True)
    base_loader.process_weights_after_loading = after_loading


def unrecognised_vllm(env: dict[str, str]) -> str | None:
    """Why this interpreter's vLLM cannot run the plugin (one clause), None when it can: the entry point is
    registered and not left out by VLLM_PLUGINS, and vLLM has every function the plugin wraps."""
    from vllm.model_executor.layers.attention import Attention, MLAAttention  # vllm: as above
    from vllm.model_executor.model_loader import base_loader  # vllm: as above

    if not any(e.name == PLUGIN_NAME for e in entry_points(group="vllm.general_plugins")):
        return f"the {PLUGIN_NAME} plugin is not registered in this interpreter: pip install --no-deps -e <repo>"
    allowed = env.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        return f"VLLM_PLUGINS={allowed!r} leaves the {PLUGIN_NAME} plugin out; add {PLUGIN_NAME}"
    needed = ((base_loader, "process_weights_after_loading"), (MLAAttention, "forward_impl"),
              (Attention, "forward"))
    missing = [f"{getattr(o, '__name__', o)}.{name}" for o, name in needed if not callable(getattr(o, name, None))]
    if missing:
        return f"this vLLM's attention is not the one the {PLUGIN_NAME} plugin knows (no {missing[0]})"
    return None


def classify(model: Any) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """(Attention layers, MLAAttention layers) of a loaded model, by name; KVPluginRefusal for any
    attention layer the plugin does not handle (module docstring)."""
    from vllm.model_executor.layers.attention import Attention, MLAAttention  # vllm: as above
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase  # vllm: as above
    from vllm.v1.attention.backend import AttentionType  # vllm: as above

    mha, mla = [], []
    for name, module in model.named_modules():
        if not isinstance(module, AttentionLayerBase) or type(module).__name__ in NO_KV_CACHE:
            continue
        kind = type(module)
        if kind not in (Attention, MLAAttention):
            raise KVPluginRefusal(f"qa_kv plugin: layer {name} is a {kind.__name__}, an attention class the plugin "
                                  "does not rewrite; it would run unemulated, so this model is refused")
        if getattr(module, "kv_sharing_target_layer_name", None):
            raise KVPluginRefusal(f"qa_kv plugin: layer {name} reads the KV cache of "
                                  f"{module.kv_sharing_target_layer_name} (KV sharing), which the plugin does not "
                                  "model; this model is refused")
        if kind is Attention and module.attn_type != AttentionType.DECODER:
            raise KVPluginRefusal(f"qa_kv plugin: layer {name} is {module.attn_type} attention; the plugin "
                                  "rewrites decoder KV caches only")
        (mha if kind is Attention else mla).append((name, module))
    return mha, mla


def layer_device(layer: Any, default: Any) -> Any:
    """The device a layer's own tensors live on (an Attention's k/v scale buffers), else `default` (where
    the loader put the model)."""
    for tensor in (*layer.buffers(), *layer.parameters()):
        return tensor.device
    return default


def install(model: Any, model_config: Any, target_device: Any) -> PluginRecord | None:
    """Rewrite K/V in every attention layer of a freshly loaded model as QA_VLLM_KV says (each layer's
    decode scales moved to its device once, here), record and log it; None (nothing installed) when the
    plugin is off for this load."""
    import vllm  # vllm: as above
    from vllm.model_executor.models.utils import extract_layer_index  # vllm: as above

    from evals.engines.vllm.kv.emulate import layer_plan, load_scales  # torch: the rewrite is torch code
    from quant.kv.cache import check_named_layers, check_scales_fit  # torch: the hf cache's own checks

    spec = spec_from_env(os.environ)
    if spec is None:
        return None
    mha, mla = classify(model)
    if not mha and not mla:
        raise KVPluginRefusal("qa_kv plugin: the model has no attention layer vLLM's Attention or MLAAttention runs; "
                              "nothing would be emulated, so it is refused")
    layers = model_config.hf_text_config.num_hidden_layers
    check_named_layers(spec, layers)
    scales = load_scales(spec)
    rewritten = []
    for name, module in [*mha, *mla]:
        index = extract_layer_index(name)
        is_mla = (name, module) in mla
        check_scales_fit(scales, layers, 1 if is_mla else module.num_kv_heads)
        plan = layer_plan(spec, scales, index, mla=is_mla).to(layer_device(module, target_device))
        (wrap_mla if is_mla else wrap_attention)(module, plan)
        rewritten.append(RewrittenLayer(
            name=name, layer=index, kind="mla" if is_mla else "attention", format=plan.fmt.name,
            k_scale=[] if plan.k_scale is None else [float(x) for x in plan.k_scale.reshape(-1)],
            v_scale=[] if plan.v_scale is None else [float(x) for x in plan.v_scale.reshape(-1)]))
    record = PluginRecord(vllm=str(vllm.__version__), pid=os.getpid(), spec=spec.model_dump(mode="json"),
                          layers=rewritten)
    folder = os.environ.get(RECORD_ENV)
    if folder:
        write_record(record, Path(folder))
    log.info("qa_kv plugin: %d attention layers rewritten (%s)", len(rewritten), describe(spec))
    log.info("%s", record.line())
    return record


def wrap_attention(layer: Any, plan: Any) -> None:
    """Install the K/V rewrite on one `Attention` layer's backend instance (module docstring)."""
    from evals.engines.vllm.kv.emulate import rewrite_pair  # torch: the rewrite is torch code

    impl = layer.impl
    if not callable(getattr(impl, "do_kv_cache_update", None)) and not layer.attn_backend.forward_includes_kv_cache_update:
        raise KVPluginRefusal(f"qa_kv plugin: layer {layer.layer_name}'s backend {type(impl).__name__} has no cache "
                              "write the plugin knows (do_kv_cache_update)")
    if layer.attn_backend.forward_includes_kv_cache_update:
        forward = impl.forward

        def forward_rewritten(attn: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
            if key is not None and value is not None:
                key, value = rewrite_pair(plan, key, value)
            return forward(attn, query, key, value, *args, **kwargs)

        impl.forward = forward_rewritten
        return
    update = impl.do_kv_cache_update

    def update_rewritten(attn: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        return update(attn, *rewrite_pair(plan, key, value), *args, **kwargs)

    impl.do_kv_cache_update = update_rewritten


def wrap_mla(layer: Any, plan: Any) -> None:
    """Install the rewrite of kv_c (as K) and k_pe (as V) on one `MLAAttention` layer (module docstring)."""
    from evals.engines.vllm.kv.emulate import rewrite  # torch: the rewrite is torch code

    if not callable(getattr(layer.impl, "do_kv_cache_update", None)):
        raise KVPluginRefusal(f"qa_kv plugin: MLA layer {layer.layer_name}'s backend {type(layer.impl).__name__} has "
                              "no cache write the plugin knows (do_kv_cache_update)")
    update, forward_impl = layer.impl.do_kv_cache_update, layer.forward_impl

    def update_rewritten(kv_c: Any, k_pe: Any, *args: Any, **kwargs: Any) -> Any:
        return update(rewrite(plan, kv_c, "k"), rewrite(plan, k_pe, "v"), *args, **kwargs)

    def forward_rewritten(q: Any, kv_c: Any, k_pe: Any, *args: Any, **kwargs: Any) -> Any:
        return forward_impl(q, rewrite(plan, kv_c, "k"), rewrite(plan, k_pe, "v"), *args, **kwargs)

    layer.impl.do_kv_cache_update = update_rewritten
    layer.forward_impl = forward_rewritten

