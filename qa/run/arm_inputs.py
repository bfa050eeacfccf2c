"""What an arm's engine and tasks receive, resolved from the spec and its run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evals.arm import ArmConfig, ArmTask
from evals.engines import parse_engine_args
from evals.engines.args import EngineArgs
from evals.engines.hf.args import HFEngineArgs
from evals.tasks.base import DEFAULT_THINK_TAGS, TaskOptions
from qa.files.rundir import RunDir
from qa.files.spec import ArmRole, ChatSettings, RunSpec, TaskSpec
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


def arm_tasks(spec: RunSpec) -> list[ArmTask]:
    """The spec's tasks as every arm runs them (options merged with [chat], limit, repeats)."""
    return [ArmTask(t.name, task_options(t, spec.chat), t.limit, t.repeats) for t in spec.tasks]


def arm_config(spec: RunSpec, role: ArmRole, rd: RunDir | None, data_dir: Path | None, *,
               base_url: str | None = None) -> ArmConfig:
    """The evals ArmConfig of an arm: its model, engine, resolved engine arguments, server and seed."""
    from qa.run.calibration import calibrated_vllm_model

    arm = spec.arms[role]
    # a vllm candidate fed by [calibration] serves the exported folder that carries the calibrated scales
    model = (calibrated_vllm_model(spec, role, rd) if rd is not None else None) or spec.arm_model(role)
    return ArmConfig(name=role, engine=arm.engine, model=model,  # type: ignore[arg-type]
                     engine_args=resolved_engine_args(spec, role, rd, base_url=base_url),
                     server=arm.server.model_dump() if arm.server is not None else None,
                     seed=spec.seed, data_dir=data_dir, env=dict(arm.env))


def static_scales_candidates(spec: RunSpec) -> list[str]:
    """The candidates that run the emulated cache with static scales ([calibration] feeds them)."""
    return [n for n in spec.candidates if (kv := emulated_kv(spec, n)) is not None and kv.scales == "static"]


def emulated_kv(spec: RunSpec, role: ArmRole) -> KVQuantSpec | None:
    """The KV spec of an arm that runs the emulated quantized KV cache (hf engine, a format other than
    none), else None."""
    args = spec.arms[role].engine_args
    if isinstance(args, HFEngineArgs) and args.kv is not None and args.kv.format != "none":
        return args.kv
    return None


def task_options(t: TaskSpec, chat: ChatSettings | None = None) -> TaskOptions:
    """The evals task options of one spec task; chat settings the task leaves unset come from `chat`
    (the spec's [chat] table, which tasks that cannot chat, such as wikitext_kl, ignore). An unset
    fewshot_as_multiturn follows chat, as lm-eval's --apply_chat_template turns it on by default."""
    from evals.tasks import supports_chat

    defaults = chat if chat is not None and supports_chat(t.name) else None

    def pick(name: str) -> Any:
        own = getattr(t, name)
        return own if own is not None or defaults is None else getattr(defaults, name)

    tags = pick("think_tags")
    chats = bool(pick("chat"))
    multiturn = pick("fewshot_as_multiturn")
    return TaskOptions(
        num_fewshot=t.num_fewshot, max_tokens=t.max_tokens, temperature=t.temperature, top_p=t.top_p,
        top_k=t.top_k, min_p=t.min_p, stop=tuple(t.stop) if t.stop is not None else None,
        chat=chats, system_prompt=pick("system_prompt"),
        fewshot_as_multiturn=chats if multiturn is None else bool(multiturn),
        chat_template_kwargs=dict(pick("chat_template_kwargs") or {}),
        think_tags=DEFAULT_THINK_TAGS if tags is None else (tuple(tags) if tags else None),  # type: ignore[arg-type]
        extra=dict(t.options), reference_signal=t.reference_signal)
