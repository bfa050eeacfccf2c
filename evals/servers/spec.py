"""What a local server is: the spec of a vLLM api_server and of a llama.cpp server (`ServerSpec`), their JSON form
(`server_spec_to_json` / `server_spec_from_json`: what resolved.json keeps), and the llama.cpp KV cache element
types by name. Nothing here starts anything (evals.servers.start)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

from pydantic import JsonValue, TypeAdapter

from evals.engines.vllm.args import VllmFlag
from evals.errors import EngineError
from quant.kv.spec import KVQuantSpec, kv_spec_from_json, kv_spec_to_json
from quant.validation import did_you_mean

ServerKind = Literal["vllm", "llamacpp"]

# KV cache element types llama.cpp's server accepts (`--cache-type-k/-v`), by their CLI names.
LLAMACPP_CACHE_TYPES: dict[str, str] = {
    "f32": "GGML_TYPE_F32",
    "f16": "GGML_TYPE_F16",
    "bf16": "GGML_TYPE_BF16",
    "q8_0": "GGML_TYPE_Q8_0",
    "q5_1": "GGML_TYPE_Q5_1",
    "q5_0": "GGML_TYPE_Q5_0",
    "q4_1": "GGML_TYPE_Q4_1",
    "q4_0": "GGML_TYPE_Q4_0",
    "iq4_nl": "GGML_TYPE_IQ4_NL",
    "mxfp4": "GGML_TYPE_MXFP4",
    "nvfp4": "GGML_TYPE_NVFP4",
}
UNQUANTIZED_CACHE_TYPES = frozenset({"f32", "f16", "bf16"})


@dataclass(frozen=True)
class VllmServerSpec:
    """vLLM's OpenAI api_server for one model folder; `args` become flags exactly as vLLM's CLI takes
    them (evals.engines.vllm.args.cli_flags) and nothing else is added: on vLLM-CPU set
    kv_cache_memory_bytes, else it reserves 92% of RAM for the KV cache. `env` is set for the server, and
    `kv` switches the qa_kv plugin on in it (evals.servers.commands.kv_plugin_env: its variables win over
    `env`; an `env` that sets QA_VLLM_KV is refused, and without a `kv` spec an inherited QA_VLLM_KV is
    dropped). What vLLM can honour of `kv` is checked where a run is resolved (evals.engines.vllm.kv.spec.
    check_vllm_kv) and by the plugin inside the server."""

    model: Path
    served_model_name: str = "model"
    args: Mapping[str, VllmFlag] = field(default_factory=dict)
    python: str | None = None  # interpreter with vllm installed; None: evals.servers.interpreter.vllm_python()
    env: Mapping[str, str] = field(default_factory=dict)
    kv: KVQuantSpec | None = None  # the K/V format emulated inside the server by the qa_kv plugin (None: off)


@dataclass(frozen=True)
class LlamaCppServerSpec:
    """llama.cpp's server (xllamacpp) for one GGUF file with the given KV cache element types."""

    gguf: Path
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = True  # a quantized V cache needs flash attention in llama.cpp
    rotate_kv: bool = True  # llama.cpp rotates a quantized K (Hadamard); False sets LLAMA_ATTN_ROT_DISABLE=1
    n_ctx: int = 2048
    n_parallel: int = 1
    threads: int = 1
    served_model_name: str = "model"
    env: Mapping[str, str] = field(default_factory=dict)  # set for the server


ServerSpec = LlamaCppServerSpec | VllmServerSpec
SERVER_SPECS: dict[ServerKind, type[ServerSpec]] = {"llamacpp": LlamaCppServerSpec, "vllm": VllmServerSpec}


def server_spec_to_json(spec: ServerSpec) -> dict[str, JsonValue]:
    """A server spec as JSON data (paths as strings, a vLLM server's `kv` as quant.kv.spec.kv_spec_to_json
    writes it); `server_spec_from_json` reads it back."""
    data: dict[str, JsonValue] = {}
    for f in fields(spec):
        value = getattr(spec, f.name)
        if isinstance(value, KVQuantSpec):
            value = kv_spec_to_json(value)
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        data[f.name] = value
    return data


def server_spec_from_json(kind: ServerKind, data: Mapping[str, JsonValue]) -> ServerSpec:
    """The server spec of `kind` that `server_spec_to_json` wrote (a `kv` read by quant.kv.spec.kv_spec_from_json)."""
    fields = dict(data)
    kv = fields.pop("kv", None) if kind == "vllm" else None
    spec = TypeAdapter(SERVER_SPECS[kind]).validate_python(fields)
    return replace(spec, kv=kv_spec_from_json(kv)) if isinstance(spec, VllmServerSpec) and kv is not None else spec


def check_cache_type(name: str) -> str:
    """Validate a llama.cpp KV cache type name; returns it."""
    if name not in LLAMACPP_CACHE_TYPES:
        hint = did_you_mean(name, LLAMACPP_CACHE_TYPES, listing="choose one of")
        raise EngineError(f"unknown llama.cpp KV cache type {name!r}; {hint}")
    return name
