"""The `vllm` engine's arguments: the toolkit's own options plus vLLM engine flags passed through as given.

Every key besides OWN_ARGS is a vLLM `EngineArgs` field (kv_cache_dtype, tensor_parallel_size, any
feature flag) with a JSON value; the names are checked against vLLM itself where it is installed
(`check_flag_names`, called when the engine is built). `engine_kwargs` turns the arguments into what
`vllm.LLM` receives, defaults written out. Imports only pydantic: no vllm, no torch at import time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError, model_validator

from evals.errors import EngineError
from quant.validation import did_you_mean, first_error

GIB = 1 << 30
CPU_KV_CACHE_BYTES = GIB  # without it vLLM-CPU reserves 92% of RAM for the KV cache
OWN_ARGS = frozenset({"allow_unsupported_kv_cache_dtype"})  # toolkit options; vLLM never sees them
VllmFlag = JsonValue  # one vLLM EngineArgs value as TOML/JSON gives it (scalars, lists, tables)


class VllmEngineArgs(BaseModel):
    """Engine arguments of a `vllm` arm: OWN_ARGS as fields, every other key a vLLM EngineArgs flag."""

    model_config = ConfigDict(frozen=True, extra="allow")
    __pydantic_extra__: dict[str, VllmFlag]

    # run a KV dtype the attention backend cannot serve, under a loud warning (its numbers are no measurement)
    allow_unsupported_kv_cache_dtype: bool = False

    @model_validator(mode="after")
    def _no_model_flag(self) -> VllmEngineArgs:
        if "model" in self.flags():
            raise ValueError("engine_args.model: the model comes from the spec's model, not engine_args")
        return self

    def flags(self) -> dict[str, VllmFlag]:
        """The vLLM EngineArgs flags as given (OWN_ARGS left out), in the order given."""
        return dict(self.__pydantic_extra__ or {})


def parse_vllm_args(args: Mapping[str, object]) -> VllmEngineArgs:
    """Validate `vllm` engine arguments; a bad key or value is a one-line EngineError."""
    try:
        return VllmEngineArgs.model_validate(dict(args))
    except ValidationError as exc:
        err = first_error(exc)
        raise EngineError(f"vllm engine argument {err.where}: {err.msg}" if err.where else err.msg) from None


def check_flag_names(args: VllmEngineArgs, known: Sequence[str]) -> None:
    """Every flag must be one of vLLM's EngineArgs fields (`known`); EngineError with a did-you-mean."""
    for key in args.flags():
        if key not in known:
            hint = did_you_mean(key, [*known, *OWN_ARGS], listing="vLLM EngineArgs fields are accepted")
            raise EngineError(f"unknown vllm engine argument {key!r}; {hint}")


def world_size(flags: Mapping[str, VllmFlag]) -> int:
    """GPUs (or CPU workers) one engine uses: tensor x pipeline x data parallel sizes."""
    size = 1
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        value = flags.get(key, 1)
        size *= int(value) if isinstance(value, int | float | str) else 1
    return size


def engine_kwargs(model: str, args: VllmEngineArgs, *,
                  on_cpu: bool | None = None) -> dict[str, VllmFlag]:
    """The keyword arguments `vllm.LLM` gets for an arm (besides the model), defaults written out;
    needs no vllm (the dry run shows them). `on_cpu` None: CPU unless torch sees CUDA."""
    if on_cpu is None:
        import torch

        on_cpu = not torch.cuda.is_available()
    kwargs = args.flags()
    kwargs.setdefault("seed", 0)
    if on_cpu:
        kwargs.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
        if world_size(kwargs) == 1:
            kwargs.setdefault("distributed_executor_backend", "uni")
    return kwargs
