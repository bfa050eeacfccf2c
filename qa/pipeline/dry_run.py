"""`qa run --dry-run`: what a run would do, read off the resolved run, without loading a model.

Per arm: its engine, model and engine arguments as the engine gets them (an offline vLLM arm: its exact
`LLM(...)` keywords), the server `qa run` would start with its exact command line (the port it picks at
start shown as PORT_SHOWN), its own environment (secrets redacted), and the notes of the preflight (what
vLLM's own check said, what could not be checked on this machine). An arm whose K/V format is emulated
inside vLLM (a `kv` table on a vllm arm or a vLLM server) shows how the qa_kv plugin is switched on: the
variables set for vLLM (beside a server's exact command line, as its prefix) and what they ask for. The tasks and the power plan are the
resolved run's own (qa.pipeline.resolved_run, qa.plan.power).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from evals.engines.vllm.args import VllmEngineArgs
from evals.engines.vllm.kv.spec import describe, plugin_env
from evals.records.env import redact_env
from evals.servers.commands import kv_plugin_env, llamacpp_command, vllm_server_command
from evals.servers.spec import VllmServerSpec
from qa.pipeline.preflight import Preflight, offline_kwargs
from qa.pipeline.resolved_run import ResolvedArm, ResolvedRun

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
    if isinstance(arm.server, VllmServerSpec) and arm.server.kv_spec is not None:
        env, spec = kv_plugin_env(arm.server), arm.server.kv_spec
    elif isinstance(arm.engine_args, VllmEngineArgs) and arm.engine_args.kv is not None:
        spec = arm.engine_args.kv
        env = plugin_env(spec)
    else:
        return {}, None
    where = "the server (its command's prefix)" if arm.server is not None else "vllm.LLM(...) in the arm's worker"
    return env, (f"K/V format emulated in vLLM by the qa_kv plugin ({describe(spec)}), switched on with "
                 f"{' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())} for {where}")


def planned_arm(run: ResolvedRun, arm: ResolvedArm, notes: tuple[str, ...]) -> PlannedArm:
    """One arm of the dry run (module doc)."""
    if arm.engine_args is None:
        return PlannedArm(arm.name, arm.record.engine, arm.record.model, {}, notes=notes)
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
                      redact_env(arm.record.env), (*notes, *([note] if note else [])))


def dry_run(run: ResolvedRun, checks: Preflight) -> list[PlannedArm]:
    """Every arm of the resolved run as the dry run shows it, with the preflight's notes."""
    return [planned_arm(run, a, checks.notes.get(a.name, ())) for a in run.arms]

