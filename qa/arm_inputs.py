"""What an arm's engine and tasks receive, resolved from the spec and its run directory."""

from __future__ import annotations

from typing import Any

from evals.engines import parse_engine_args
from evals.engines.args import EngineArgs
from evals.engines.hf.args import HFEngineArgs
from evals.tasks.base import DEFAULT_THINK_TAGS, TaskOptions
from qa.rundir import RunDir
from qa.spec import ArmRole, ChatSettings, RunSpec, TaskSpec
from quant.kv_spec import KVQuantSpec


def resolved_engine_args(spec: RunSpec, role: ArmRole, rd: RunDir | None, *,
                         base_url: str | None = None) -> EngineArgs:
    """An arm's engine arguments as its engine receives them: trust_remote_code from the spec, the
    calibrated scales of a static-scales candidate, the base_url of a server `qa run` started."""
    arm = spec.arms[role]
    given = arm.given_args()
    if spec.trust_remote_code and arm.engine in ("hf", "vllm"):
        given.setdefault("trust_remote_code", True)  # off unless the spec says so
    kv = arm.engine_args.kv if isinstance(arm.engine_args, HFEngineArgs) else None
    if (kv is not None and kv.scales == "static" and "scales" not in given and spec.calibration is not None
            and rd is not None):
        given["scales"] = str(rd.scales)
    if base_url is not None:
        given["base_url"] = base_url
    return parse_engine_args(arm.engine, given)


def emulated_kv(spec: RunSpec, role: ArmRole) -> KVQuantSpec | None:
    """The KV spec of an arm that runs the emulated quantized KV cache (hf engine, a format other than
    none), else None."""
    args = spec.arms[role].engine_args
    if isinstance(args, HFEngineArgs) and args.kv is not None and args.kv.format != "none":
        return args.kv
    return None


def task_options(t: TaskSpec, chat: ChatSettings | None = None) -> TaskOptions:
    """The evals task options of one spec task; chat settings the task leaves unset come from `chat`
    (the spec's [chat] table)."""
    def pick(name: str) -> Any:
        own = getattr(t, name)
        return own if own is not None or chat is None else getattr(chat, name)

    tags = pick("think_tags")
    return TaskOptions(
        num_fewshot=t.num_fewshot, max_tokens=t.max_tokens, temperature=t.temperature, top_p=t.top_p,
        top_k=t.top_k, min_p=t.min_p, stop=tuple(t.stop) if t.stop is not None else None,
        chat=bool(pick("chat")), system_prompt=pick("system_prompt"),
        fewshot_as_multiturn=bool(pick("fewshot_as_multiturn")),
        chat_template_kwargs=dict(pick("chat_template_kwargs") or {}),
        think_tags=DEFAULT_THINK_TAGS if tags is None else (tuple(tags) if tags else None),  # type: ignore[arg-type]
        extra=dict(t.options))
