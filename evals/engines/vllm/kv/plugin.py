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

- the spec in `QA_VLLM_KV` is read and checked, the plugin's one check of its environment
  (evals.engines.vllm.kv.spec.spec_from_env: a spec vLLM cannot run refuses the load in one line);
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
- the engine's resolved configuration is checked for paths that bypass the rewrite (evals.engines.vllm.kv.
  resolved: decode context parallelism, a quantized cache resolved from "auto", fused rope + cache-write
  passes), which refuse the model in one line;
- the layers are counted and recorded (evals.engines.vllm.kv.record): a file in `QA_VLLM_KV_RECORD`
  per load (its index in this process and its role: the target model or a speculative drafter) and one log
  line. Each cache write also adds its tokens (slot_mapping >= 0) to the layer plan's device counter
  (`emulate.count_tokens`, captured with a CUDA graph and replayed with it); the plans stay reachable
  (`LOADS`, and `qa_kv_plan` on each layer) and `load_counts` reads them, through vLLM's
  `collective_rpc(COUNTS_METHOD)` on every worker, after an arm.
Nothing of vLLM's compiled graph changes: the rewrites run inside vLLM's own opaque attention ops.
This and resolved are the modules that import vllm (inside functions: vLLM loads plugins while importing
itself).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from evals.engines.vllm.kv.record import COUNTS_METHOD, LoadRole, PluginRecord, RewrittenLayer, write_record
from evals.engines.vllm.kv.resolved import bypass, layer_kv_dtypes
from evals.engines.vllm.kv.spec import PLUGIN_ENV, PLUGIN_NAME, RECORD_ENV, describe, spec_from_env
from quant.kv.skip_layers import config_layers, sliding_mismatch

log = logging.getLogger("vllm.qa_kv")  # vLLM's handlers: the line reaches a server's log
WRAPPED = "_qa_kv_wrapped"  # marks the wrapped loader function (register is idempotent)
NO_KV_CACHE = frozenset({"MMEncoderAttention"})  # attention classes that keep no KV cache


class KVPluginRefusal(RuntimeError):
    """The loaded model has an attention layer the plugin cannot rewrite, or the engine a path that would bypass
    the rewrite (the message says which)."""


@dataclass(frozen=True)
class InstalledLoad:
    """One model load this process rewrote: its index in the process, its role, each layer's name and plan."""

    index: int
    role: LoadRole
    layers: tuple[tuple[str, Any], ...]  # (vLLM layer name, emulate.LayerPlan)
    engine: int = 0  # which engine of this process loaded it (engine_number)


LOADS: list[InstalledLoad] = []  # every load installed in this process, in order (read by load_counts)
ENGINE_ATTR = "_qa_kv_engine"  # set on an engine's VllmConfig at its first load: the loads that engine owns


def engine_number(config: Any) -> int:
    """The number of the engine whose configuration is `config` in this process (a new one for a config not
    seen before, or for a load outside any engine's context): its target and drafter loads share it."""
    number = getattr(config, ENGINE_ATTR, None) if config is not None else None
    if number is None:
        number = 1 + max((load.engine for load in LOADS), default=-1)
        if config is not None:
            object.__setattr__(config, ENGINE_ATTR, number)
    return int(number)


def load_counts() -> str:
    """Every load of this process's newest engine, its per-layer device counters as JSON (evals.engines.vllm.kv.record.LoadCounts
    list): [tokens written, non-finite K/V elements] per layer. Reads each counter back to the host: call it
    after an arm, never inside a step."""
    latest = LOADS[-1].engine if LOADS else None  # an engine built after another in this process: only its loads
    return json.dumps([{"pid": os.getpid(), "load": load.index, "role": load.role,
                        "layers": {name: [int(x) for x in plan.counts.tolist()] for name, plan in load.layers}}
                       for load in LOADS if load.engine == latest])


def expose_counts() -> None:
    """Make `collective_rpc(COUNTS_METHOD)` answer `load_counts()` on this process's workers (a method on
    vLLM's WorkerWrapperBase, which every executor's workers are; a method name travels without pickling)."""
    from vllm.v1.worker.worker_base import WorkerWrapperBase  # vllm: the plugin runs inside vLLM

    if not hasattr(WorkerWrapperBase, COUNTS_METHOD):
        setattr(WorkerWrapperBase, COUNTS_METHOD, lambda self: load_counts())


def register() -> None:
    """The entry point: with QA_VLLM_KV set, hook model loading (idempotent); `install` reads and checks the
    spec at each load."""
    if not os.environ.get(PLUGIN_ENV, "").strip():
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
    """Rewrite K/V in every attention layer of a freshly loaded model as QA_VLLM_KV says (read and checked here,
    the plugin's one check of its environment: spec_from_env; each layer's decode scales moved to its device
    once, here), record and log it; None (nothing installed) when the plugin is off for this load."""
    import vllm  # vllm: as above
    from vllm import distributed  # vllm: as above (the tensor-parallel group, set up before the load)
    from vllm.config import get_current_vllm_config_or_none  # vllm: as above
    from vllm.model_executor.models.utils import extract_layer_index  # vllm: as above

    from evals.engines.vllm.kv.emulate import layer_plan, load_scales  # torch: the rewrite is torch code
    from evals.engines.vllm.kv.heads import rank_scales  # torch: as above
    from evals.engines.vllm.kv.query import install_io_rounding, io_refusal  # torch: as above
    from quant.kv.cache import check_named_layers, check_scales_fit  # torch: the hf cache's own checks

    spec = spec_from_env(os.environ)  # EngineError (a one-line refusal) for a spec vLLM cannot run
    if spec is None:
        return None
    mha, mla = classify(model)
    if not mha and not mla:
        raise KVPluginRefusal("qa_kv plugin: the model has no attention layer vLLM's Attention or MLAAttention runs; "
                              "nothing would be emulated, so it is refused")
    config = get_current_vllm_config_or_none()  # the engine's resolved configuration (set while it loads)
    if config is not None and (why := bypass(config, layer_kv_dtypes([*mha, *mla]), mha=bool(mha), mla=bool(mla))):
        raise KVPluginRefusal(f"qa_kv plugin: {why}; refusing rather than run the arm unemulated")
    role: LoadRole = "drafter" if config is not None and model_config is not config.model_config else "target"
    layers = model_config.hf_text_config.num_hidden_layers
    check_named_layers(spec, layers)
    skips = spec.layer_skips(config_layers(model_config.hf_text_config))  # vLLM's skip_layers + TurboQuant boundary
    total_heads = 1 if mla and not mha else model_config.get_total_num_kv_heads()  # MLA: one latent head
    tp = ((distributed.get_tensor_model_parallel_world_size(), distributed.get_tensor_model_parallel_rank())
          if distributed.model_parallel_is_initialized() else (1, 0))  # a load outside an engine: one rank
    scales, heads = rank_scales(load_scales(spec), total_heads, *tp)  # per-head: this rank's KV heads'
    rewritten, plans = [], []
    for name, module in [*mha, *mla]:
        index = extract_layer_index(name)
        is_mla = (name, module) in mla
        check_scales_fit(scales, layers, 1 if is_mla else module.num_kv_heads)
        engine_sliding = not is_mla and getattr(module, "sliding_window", None) is not None  # MLA: indices only
        if (why := sliding_mismatch(spec.skip_layers, skips, index, engine_sliding)) is not None:
            raise KVPluginRefusal(f"qa_kv plugin: {why}; refusing")
        plan = layer_plan(spec, scales, index, mla=is_mla, skips=skips).to(layer_device(module, target_device))
        if (why := io_refusal(spec, is_mla)) is not None:
            raise KVPluginRefusal(f"qa_kv plugin: layer {name}: {why}")
        (wrap_mla if is_mla else wrap_attention)(module, plan)
        if not plan.identity:  # Q / output to FP8 where the spec asks (evals.engines.vllm.kv.query)
            install_io_rounding(module, spec)
        module.qa_kv_plan = plan  # reachable from the layer as well as from LOADS
        plans.append((name, plan))
        rewritten.append(RewrittenLayer(
            name=name, layer=index, kind="mla" if is_mla else "attention", format=plan.fmt.name,
            k_scale=[] if plan.k_scale is None else [float(x) for x in plan.k_scale.reshape(-1)],
            v_scale=[] if plan.v_scale is None else [float(x) for x in plan.v_scale.reshape(-1)],
            kv_heads=[] if heads is None or plan.k_scale is None or not plan.k_scale.dim() else list(heads),
            # the model's KV heads, not this rank's share: a tensor-parallel rank holds num_kv_heads of them
            # (one each, replicated, where ranks outnumber them)
            num_kv_heads=None if is_mla else min(int(module.num_kv_heads) * tp[0], total_heads),
            head_size=None if is_mla else int(module.head_size)))
    LOADS.append(InstalledLoad(index=len(LOADS), role=role, layers=tuple(plans), engine=engine_number(config)))
    expose_counts()
    record = PluginRecord(vllm=str(vllm.__version__), pid=os.getpid(), load=LOADS[-1].index, role=role,
                          spec=spec.model_dump(mode="json"), layers=rewritten)
    folder = os.environ.get(RECORD_ENV)
    if folder:
        write_record(record, Path(folder))
    log.info("qa_kv plugin: %d attention layers rewritten (%s)", len(rewritten), describe(spec))
    log.info("%s", record.line())
    return record


def wrap_attention(layer: Any, plan: Any) -> None:
    """Install the K/V rewrite and the token count on one `Attention` layer's backend instance (module
    docstring); nothing here reads a value, so a NaN in K or V goes on to the cache as the kernel would store it."""
    from evals.engines.vllm.kv.emulate import count_tokens, rewrite_pair  # torch: the rewrite is torch code

    impl = layer.impl
    if not callable(getattr(impl, "do_kv_cache_update", None)) and not layer.attn_backend.forward_includes_kv_cache_update:
        raise KVPluginRefusal(f"qa_kv plugin: layer {layer.layer_name}'s backend {type(impl).__name__} has no cache "
                              "write the plugin knows (do_kv_cache_update)")
    if layer.attn_backend.forward_includes_kv_cache_update:
        forward = impl.forward

        def forward_rewritten(attn: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
            if key is not None and value is not None:
                key, value = rewrite_pair(plan, key, value)
                metadata = kwargs.get("attn_metadata", args[1] if len(args) > 1 else None)
                slots = getattr(metadata, "slot_mapping", None)
                if slots is not None:
                    count_tokens(plan, slots)
            return forward(attn, query, key, value, *args, **kwargs)

        impl.forward = forward_rewritten
        return
    update = impl.do_kv_cache_update

    def update_rewritten(attn: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        # vLLM 0.32 calls do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        count_tokens(plan, kwargs["slot_mapping"] if "slot_mapping" in kwargs else args[1])
        return update(attn, *rewrite_pair(plan, key, value), *args, **kwargs)

    impl.do_kv_cache_update = update_rewritten


def wrap_mla(layer: Any, plan: Any) -> None:
    """Install the rewrite of kv_c (as K) and k_pe (as V) on one `MLAAttention` layer (module docstring): the
    cache write counts its tokens and non-finite values, the prefill's fresh kv_c is rewritten uncounted."""
    from evals.engines.vllm.kv.emulate import count_tokens, rewrite  # torch: the rewrite is torch code

    if not callable(getattr(layer.impl, "do_kv_cache_update", None)):
        raise KVPluginRefusal(f"qa_kv plugin: MLA layer {layer.layer_name}'s backend {type(layer.impl).__name__} has "
                              "no cache write the plugin knows (do_kv_cache_update)")
    update, forward_impl = layer.impl.do_kv_cache_update, layer.forward_impl

    def update_rewritten(kv_c: Any, k_pe: Any, *args: Any, **kwargs: Any) -> Any:
        # vLLM 0.32 calls do_kv_cache_update(kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale)
        count_tokens(plan, kwargs["slot_mapping"] if "slot_mapping" in kwargs else args[1])
        return update(rewrite(plan, kv_c, "k"), rewrite(plan, k_pe, "v"), *args, **kwargs)

    def forward_rewritten(q: Any, kv_c: Any, k_pe: Any, *args: Any, **kwargs: Any) -> Any:
        return forward_impl(q, rewrite(plan, kv_c, "k", count=False), rewrite(plan, k_pe, "v", count=False),
                            *args, **kwargs)

    layer.impl.do_kv_cache_update = update_rewritten
    layer.forward_impl = forward_rewritten

