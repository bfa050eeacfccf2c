"""What vLLM + the qa_kv plugin can honour of a `kv = { ... }` spec, and the environment that switches it on.

The plugin is inert unless `QA_VLLM_KV` holds a KVQuantSpec as JSON (quant.kv.spec.kv_spec_to_json, the form
resolved.json keeps): an environment variable reaches every process vLLM starts on this machine (engine core,
tensor/data-parallel workers, `vllm serve` children); Ray workers get only what vLLM copies to them, so
`plugin_env` adds both names to `VLLM_RAY_EXTRA_ENV_VARS_TO_COPY`. `QA_VLLM_KV_RECORD` names a folder where
each process that loads the model writes what it rewrote (evals.engines.vllm.kv.record).

Refused in one line by `refusal` / `check_vllm_kv`, the one check (a vLLM server's kv where a run is resolved,
qa.pipeline.resolve; an offline arm's where its engine arguments are parsed, evals.engines.vllm.args; and the
plugin's own environment, `spec_from_env`): what vLLM's cache cannot do or the plugin does not model: the hf
engine's FP8 recent window and prefix-cache keys (vLLM has its own prefix cache), engine profiles and fault
hooks (the hf emulator's), a fresh-K/V prefill read, per-sequence dynamic decode scales for tensor-scaled
formats (vLLM's cache blocks are shared between sequences, so a per-sequence scale has no meaning there:
calibrate with `qa calibrate` or use scales = "constant"), and a real quantized kv_cache_dtype together with an
emulated format (the emulated values would be quantized twice). Imports neither torch nor vllm.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from evals.errors import EngineError
from quant.kv.spec import KVQuantSpec, kv_spec_from_json, kv_spec_to_json

PLUGIN_ENV = "QA_VLLM_KV"  # the kv spec as JSON: the plugin rewrites K/V only when it is set
RECORD_ENV = "QA_VLLM_KV_RECORD"  # a folder: each process writes what it rewrote at model load
# vLLM's list of extra variables its Ray executor copies to the workers (vllm/ray/ray_env.py: only VLLM_*,
# HF_*, NCCL_* and a few others by default)
RAY_COPY_ENV = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"
PLUGIN_NAME = "qa_kv"  # the entry point's name in the vllm.general_plugins group (pyproject.toml)
# vLLM dtypes that store K/V at the model's own precision: the only ones the emulated values may go into
UNQUANTIZED_DTYPES = frozenset({"auto", "bfloat16", "float16", "float32", "half", "float"})
# formats with a per-tensor/per-head decode scale (quant.formats.registry: needs_tensor_scale); the others scale
# themselves per block (qa_mxfp4) or per row (qa_int8, qa_int4), so "dynamic" needs no per-sequence state for them
TENSOR_SCALED = frozenset({"nvfp4", "nvfp4_4over6", "fp8_e4m3", "fp8_e5m2"})
DEFAULTS = KVQuantSpec()
# model architectures whose attention layers are their own classes, not vLLM's Attention or MLAAttention
# (vLLM 0.32, read in vllm/models/ and model_executor/models/registry.py): the plugin refuses them when the
# model loads, so a run that asks to emulate their cache is refused before, from config.json alone
UNREWRITABLE: dict[str, str] = {
    "DeepseekV4ForCausalLM": "DeepseekV4Attention (vllm/models/deepseek_v4/attention.py)",
    "DeepseekV4ForConditionalGeneration": "DeepseekV4Attention (vllm/models/deepseek_v4/attention.py)",
    "DeepseekV41ForCausalLM": ("DeepseekV4Attention (vllm/models/deepseek_v41/attention.py: its own packed "
                               "fp8_ds_mla / nvfp4_ds_mla cache with an MXFP8 sliding-window record)"),
}


def used_formats(spec: KVQuantSpec) -> set[str]:
    """Every format some layer stores (besides "none")."""
    return {spec.format, *spec.layer_formats.values()} - {"none"}


def refusal(spec: KVQuantSpec, kv_cache_dtype: str = "auto") -> str | None:
    """Why vLLM + the plugin cannot run `spec` (one clause), None when it can; see the module docstring."""
    if spec.recent_window:
        return ("recent_window: vLLM's cache stores one format per layer, so an FP8 recent window is the hf "
                "engine's alone; set recent_window = 0 or run this arm on the hf engine")
    if spec.prefix_cache is not None:
        return ("prefix_cache is the hf engine's prefix cache; vLLM has its own: drop kv.prefix_cache and set "
                "enable_prefix_caching (default on)")
    if spec.profile is not None:
        return (f"profile {spec.profile!r} models an attention kernel in the hf engine; the vLLM plugin rounds "
                "only K and V: drop profile")
    if not spec.prefill_reads_quantized:
        return "prefill_reads_quantized = false: vLLM's attention reads what it wrote; drop it"
    faults = [k for k in ("scale_multiplier", "v_scale_layout", "corrupt_block_fraction", "corrupt_seed")
              if getattr(spec, k) != getattr(DEFAULTS, k)]
    if faults:
        return f"{faults[0]}: fault injection is the hf emulator's, not the vLLM plugin's; drop it"
    scaled = sorted(used_formats(spec) & TENSOR_SCALED)
    if spec.scales == "dynamic" and scaled:
        return (f"scales = 'dynamic' with {scaled[0]}: vLLM shares cache blocks between sequences, so it has "
                "no per-sequence scale; use scales = 'static' (qa calibrate) or 'constant'")
    if used_formats(spec) and kv_cache_dtype not in UNQUANTIZED_DTYPES:
        return (f"kv_cache_dtype {kv_cache_dtype!r} with an emulated {min(used_formats(spec))} cache: "
                "the values would be quantized twice; leave kv_cache_dtype at auto")
    return None


def architecture_refusal(config_json: Path) -> str | None:
    """Why the plugin cannot rewrite the model a config.json describes (its `architectures`; one clause), None
    when nothing says so (an unreadable file says nothing: the plugin still checks every layer at load)."""
    try:
        config = json.loads(config_json.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    names = config.get("architectures") if isinstance(config, dict) else None
    for name in names if isinstance(names, list) else []:
        if name in UNREWRITABLE:
            return (f"{name}'s attention is {UNREWRITABLE[name]}, neither vLLM's Attention nor MLAAttention: the "
                    "qa_kv plugin cannot emulate its KV cache (gate the native cache, or run the candidate on "
                    "a model the plugin rewrites)")
    return None


def check_vllm_kv(spec: KVQuantSpec, kv_cache_dtype: str = "auto", *, where: str = "vllm") -> None:
    """EngineError (one line) when vLLM + the plugin cannot run `spec` (`refusal`)."""
    why = refusal(spec, kv_cache_dtype)
    if why is not None:
        raise EngineError(f"{where}: kv cache spec: {why}")


def plugin_env(spec: KVQuantSpec, record_dir: Path | None = None, *, ray_extra: str = "") -> dict[str, str]:
    """The variables that switch the plugin on for `spec` (and where it records what it rewrote), with both
    names added to `ray_extra` (the VLLM_RAY_EXTRA_ENV_VARS_TO_COPY already set) so Ray workers get them too."""
    env = {PLUGIN_ENV: json.dumps(kv_spec_to_json(spec), separators=(",", ":"), sort_keys=True)}
    if record_dir is not None:
        env[RECORD_ENV] = str(record_dir)
    names = [n for n in ray_extra.split(",") if n.strip()]
    env[RAY_COPY_ENV] = ",".join([*names, *(n for n in (PLUGIN_ENV, RECORD_ENV) if n not in names)])
    return env


def spec_from_env(env: Mapping[str, str]) -> KVQuantSpec | None:
    """The spec the plugin runs, read and checked (`check_vllm_kv`) from `QA_VLLM_KV` (None: unset or empty:
    the plugin is off); EngineError when the JSON is not a kv spec vLLM can run."""
    raw = env.get(PLUGIN_ENV, "").strip()
    if not raw:
        return None
    try:
        spec = kv_spec_from_json(json.loads(raw))
    except json.JSONDecodeError as exc:
        raise EngineError(f"{PLUGIN_ENV}: not JSON ({exc.msg} at {exc.pos})") from None
    except ValueError as exc:  # QuantError is a ValueError
        raise EngineError(f"{PLUGIN_ENV}: {exc}") from None
    check_vllm_kv(spec, where=PLUGIN_ENV)
    return spec


def describe(spec: KVQuantSpec) -> str:
    """One line naming the emulated format, its scales and layer overrides (the dry run, the log)."""
    parts = [f"format {spec.format}"]
    if spec.layer_formats:
        parts.append("layer_formats " + ", ".join(f"{k}={v}" for k, v in sorted(spec.layer_formats.items())))
    if spec.skip_layers:
        parts.append(f"skip_layers {list(spec.skip_layers)}")
    scales = spec.scales
    if spec.scales == "static":
        scales += f" from {spec.scales_file}"
    elif spec.scales == "constant":
        scales += f" {spec.constant_scale}"
    parts.append(f"scales {scales}")
    return ", ".join(parts)
