"""What an arm's engine and tasks receive, resolved from the spec and its run directory."""

from __future__ import annotations

from evals.engines import parse_engine_args
from evals.engines.args import EngineArgs
from evals.engines.hf.args import HFEngineArgs
from evals.tasks.base import TaskOptions
from qa.rundir import RunDir
from qa.spec import ArmRole, RunSpec, TaskSpec
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


def task_options(t: TaskSpec) -> TaskOptions:
    """The evals task options of one spec task."""
    return TaskOptions(num_fewshot=t.num_fewshot, max_tokens=t.max_tokens, temperature=t.temperature,
                       extra=dict(t.options))
