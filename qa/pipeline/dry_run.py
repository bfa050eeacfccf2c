"""`qa run --dry-run`: what a run would do, read off the resolved run, without loading a model.

Per arm: its engine, model and engine arguments as the engine gets them (an offline vLLM arm: its exact
`LLM(...)` keywords), the server `qa run` would start with its exact command line (the port it picks at
start shown as PORT_SHOWN), its own environment (secrets redacted), and the notes of the preflight (what
vLLM's own check said, what could not be checked on this machine). An arm whose K/V format is emulated
inside vLLM (a `kv` table on a vllm arm or a vLLM server) shows how the qa_kv plugin is switched on: the
variables set for vLLM (beside a server's exact command line, as its prefix) and what they ask for. An arm
with a quantized emulated cache (hf or plugin) shows the layers it quantizes and those it keeps unquantized,
and why (skip_layers, TurboQuant's boundary: quant.kv.skip_layers). The tasks and the power plan are the
resolved run's own (qa.pipeline.resolved_run, qa.plan.power).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from evals.engines.vllm.args import VllmEngineArgs
from evals.engines.vllm.kv.spec import describe, plugin_env
from evals.errors import ModelError
from evals.models.config import read_model_config
from evals.records.env import redact_env
from evals.servers.commands import kv_plugin_env, llamacpp_command, vllm_server_command
from evals.servers.spec import VllmServerSpec
from qa.pipeline.preflight import Preflight, offline_kwargs
from qa.pipeline.resolved_run import ResolvedArm, ResolvedRun
from quant.errors import QuantError
from quant.kv.skip_layers import config_layers, describe_layers
from quant.kv.spec import KVQuantSpec

PORT_SHOWN = "<free port>"  # a server's port is picked when it starts


@dataclass(frozen=True)
class PlannedArm:
    """One arm as a dry run shows it."""

    name: str
    engine: str
    model: str
    engine_args: dict[str, Any]
    server: dict[str, Any] | None = None  # the local server `qa run` starts for the arm
    command: tuple[str, ...] = ()  # that server's exact command line (the port shown as PORT_SHOWN)
    env: dict[str, str] = field(default_factory=dict)  # the arm's own variables, secrets redacted
    notes: tuple[str, ...] = ()
    kv_layers: str | None = None  # an emulated K/V cache's layers: quantized (by format), skipped and why


def shown_command(arm: ResolvedArm) -> tuple[str, ...]:
    """The arm's server command line as it would start, its port shown as PORT_SHOWN (() without a server)."""
    if arm.server is None:
        return ()
    cmd = vllm_server_command(arm.server, 0) if isinstance(arm.server, VllmServerSpec) else llamacpp_command(arm.server, 0)
    at = cmd.index("--port") + 1
    return (*cmd[:at], PORT_SHOWN, *cmd[at + 1:])


def plugin_switch(arm: ResolvedArm) -> tuple[dict[str, str], str | None]:
    """(the variables that switch the qa_kv plugin on for the arm's vLLM, a note saying what they ask for);
    ({}, None) when its K/V format is not emulated in vLLM."""
    if isinstance(arm.server, VllmServerSpec) and arm.server.kv is not None:
        env, spec = kv_plugin_env(arm.server), arm.server.kv
    elif isinstance(arm.engine_args, VllmEngineArgs) and arm.engine_args.kv is not None:
        spec = arm.engine_args.kv
        env = plugin_env(spec)
    else:
        return {}, None
    where = "the server (its command's prefix)" if arm.server is not None else "vllm.LLM(...) in the arm's worker"
    return env, (f"K/V format emulated in vLLM by the qa_kv plugin ({describe(spec)}), switched on with "
                 f"{' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())} for {where}")


def arm_kv_spec(arm: ResolvedArm) -> KVQuantSpec | None:
    """The K/V cache the arm emulates: the hf cache's, or the one the qa_kv plugin runs in its vLLM."""
    if isinstance(arm.server, VllmServerSpec) and arm.server.kv is not None:
        return arm.server.kv
    if isinstance(arm.engine_args, VllmEngineArgs) and arm.engine_args.kv is not None:
        return arm.engine_args.kv
    return arm.kv


def kv_layers(run: ResolvedRun, arm: ResolvedArm) -> str | None:
    """The layers the arm's emulated cache quantizes and skips (quant.kv.skip_layers, from the model's config
    as transformers reads it: what the hf cache and the plugin resolve); None without a quantized cache."""
    spec = arm_kv_spec(arm)
    if spec is None or spec.format == "none" and not set(spec.layer_formats.values()) - {"none"}:
        return None
    if arm.model is None or arm.model.path is None:
        return "not resolved: the model's config.json is not on this machine"
    try:
        config = read_model_config(arm.model.path, trust_remote_code=run.record.trust_remote_code)
        layers = config_layers(config.get_text_config(decoder=True))
        return describe_layers(spec.layer_skips(layers), layers, spec.format, spec.layer_formats)
    except (QuantError, ModelError) as exc:
        return f"cannot be resolved: {exc}"


def planned_arm(run: ResolvedRun, arm: ResolvedArm, notes: tuple[str, ...]) -> PlannedArm:
    """One arm of the dry run (module doc)."""
    if arm.engine_args is None:
        return PlannedArm(arm.name, arm.record.engine, arm.record.model, {}, notes=notes, kv_layers=kv_layers(run, arm))
    args: dict[str, Any] = arm.engine_args.model_dump(mode="json")
    if isinstance(arm.engine_args, VllmEngineArgs):
        args = {k: v for k, v in offline_kwargs(run, arm).items() if k != "model"}
    server = None
    command = shown_command(arm)
    switch, note = plugin_switch(arm)
    spec = run.spec.arms[arm.name].server
    if spec is not None:
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in switch.items())
        server = {**spec.model_dump(exclude_none=True), "command": prefix + shlex.join(command)}
    return PlannedArm(arm.name, arm.record.engine, arm.record.model, args, server, command,
                      redact_env(arm.record.env), (*notes, *([note] if note else [])), kv_layers(run, arm))


def dry_run(run: ResolvedRun, checks: Preflight) -> list[PlannedArm]:
    """Every arm of the resolved run as the dry run shows it, with the preflight's notes."""
    return [planned_arm(run, a, checks.notes.get(a.name, ())) for a in run.arms]

