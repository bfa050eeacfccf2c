"""resolved.json: what `qa run` resolved from the spec, once, before any arm started.

The parent process resolves the spec into a `qa.pipeline.resolved_run.ResolvedRun` (policy, tasks with their item
selections, arms with their engines, servers and interpreters) and writes this record of it into the run
directory. Every later step reads the record instead of the spec: a worker builds its arm from it, and
`qa gate RUN` / `qa report RUN` / the API re-gate under the policy it names from any working directory
(its bytes are copied next to it as policy.toml, checked against the sha256 here).

In memory the paths are as resolved (the policy, the data folder, an arm's interpreter: absolute). On disk
every absolute one is written as "{run}/" + its path relative to the run directory (`save_resolved`) and
made absolute again against it when read (`load_resolved`), so a run folder names no machine path and a
worker reads back exactly what was resolved.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from qa.errors import QAError
from qa.files.spec import CalibrationStep
from quant.fileio import atomic_write_text
from quant.validation import first_error

RESOLVED_SCHEMA = 1
ArmKind = Literal["baseline", "rerun", "candidate"]
ServerKind = Literal["llamacpp", "vllm"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PolicyRecord(_Frozen):
    """The gate policy the run is gated under: where it was read and the sha256 of its TOML bytes."""

    name: str
    ref: str  # as the spec names it: "default" or a path as written
    path: str | None  # the file it was read from, absolute; None: the shipped default
    sha256: str  # of the TOML bytes, which the run directory keeps as policy.toml


def text_sha256(text: str) -> str:
    """sha256 (hex) of a text's UTF-8 bytes: a policy's fingerprint in this record."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class TaskRecord(_Frozen):
    """One task as every arm runs it."""

    name: str
    options: dict[str, JsonValue]  # evals.tasks.base.TaskOptions, as JSON
    limit: int | None
    repeats: int
    items_available: int  # items of the task's evaluation split
    items: int  # items of the seeded selection every arm runs
    look_sizes: list[int] = Field(default_factory=list)  # items at each sequential look; [] = fixed n


class ServerRecord(_Frozen):
    """The local server a worker starts for an `openai` arm (127.0.0.1, a free port chosen at start)."""

    kind: ServerKind
    spec: dict[str, JsonValue]  # the fields of evals.servers.spec.LlamaCppServerSpec / VllmServerSpec
    ready_timeout_s: float | None = None
    log: str  # its log, relative to the run directory


class ArmRecord(_Frozen):
    """One arm: what its worker builds (engine, model, arguments, server, interpreter) and where it writes."""

    name: str
    kind: ArmKind
    engine: Literal["hf", "vllm", "openai", "lmeval"]
    model: str  # the named model the arm serves
    load: str  # what its engine loads: the model, or the folder carrying calibrated scales to vLLM
    engine_args: dict[str, JsonValue] | None  # as the engine receives them, the fields set only; None: lmeval
    server_settings: dict[str, JsonValue] | None = None  # the spec's server table (fingerprinted in arm.json)
    server: ServerRecord | None = None
    python: str | None = None  # the interpreter of its worker; None: it runs no worker
    env: dict[str, str] = Field(default_factory=dict)  # its own variables, as the spec sets them
    runs: bool  # runs an engine here (False: an lm-eval folder, or a baseline copied from an earlier run)
    records: str  # its records folder (relative), or an lm-eval --log_samples folder (absolute)
    out: str | None = None  # a candidate's folder for comparison, verdict and report (relative; "." = root)
    reused_from: str | None = None  # the earlier run a baseline is copied from, absolute


class CalibrationRecord(_Frozen):
    """The calibration step: the spec's settings and the candidate model it runs on."""

    step: CalibrationStep
    arm: str  # the candidate whose model, device and dtype it runs with
    model: str
    device: str
    dtype: str
    scales: str  # the scales file it writes (relative)
    vllm_model: str | None = None  # the model folder it also writes for vLLM candidates it feeds (relative)


class ResolvedRecord(_Frozen):
    """The whole resolved.json."""

    schema_version: Literal[1] = RESOLVED_SCHEMA
    name: str
    model: str  # the spec's model (arms may serve their own)
    seed: int
    trust_remote_code: bool = False
    data_dir: str | None  # where every arm reads its data, absolute; None: the hub
    policy: PolicyRecord
    sequential: bool  # the policy has looks for some task: arms advance in blocks (qa.pipeline.sequential)
    tasks: list[TaskRecord]
    arms: list[ArmRecord]
    calibration: CalibrationRecord | None = None

    def arm(self, name: str) -> ArmRecord:
        """The arm named `name`; QAError when the run has none."""
        for a in self.arms:
            if a.name == name:
                return a
        raise QAError(f"the run has no arm {name!r} (arms: {', '.join(a.name for a in self.arms)})")

    @property
    def candidates(self) -> list[ArmRecord]:
        """The candidate arms, in spec order."""
        return [a for a in self.arms if a.kind == "candidate"]


RUN_MARK = "{run}/"  # on disk: a path relative to the run directory that is absolute in memory


def _paths(data: dict[str, Any], change: Callable[[str], str]) -> dict[str, Any]:
    """A copy of resolved.json's data with `change` applied to each path that may name a file outside the run
    directory: data_dir, policy.path, each arm's python, records, reused_from and an hf arm's engine_args.scales."""
    out = {**data, "policy": dict(data["policy"]), "arms": [dict(a) for a in data["arms"]]}
    if isinstance(out.get("data_dir"), str):
        out["data_dir"] = change(out["data_dir"])
    if isinstance(out["policy"].get("path"), str):
        out["policy"]["path"] = change(out["policy"]["path"])
    for arm in out["arms"]:
        for key in ("python", "records", "reused_from"):
            if isinstance(arm.get(key), str):
                arm[key] = change(arm[key])
        args = arm.get("engine_args")
        if isinstance(args, dict) and isinstance(args.get("scales"), str):
            arm["engine_args"] = {**args, "scales": change(args["scales"])}
    return out


def save_resolved(path: Path, record: ResolvedRecord) -> None:
    """Write resolved.json atomically; an absolute path is written as RUN_MARK + its path relative to the run
    directory (path's folder), so the file names no machine path; other paths are kept as they are."""
    run = path.parent.resolve()

    def relative(p: str) -> str:
        return RUN_MARK + os.path.relpath(p, run) if os.path.isabs(p) else p

    data = _paths(record.model_dump(mode="json"), relative)
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def load_resolved(path: Path) -> ResolvedRecord:
    """Read resolved.json; a missing or invalid file is one QAError line."""
    if not path.is_file():
        raise QAError(f"{path}: no resolved.json (a run directory written by `qa run`)")
    run = path.parent.resolve()

    def absolute(p: str) -> str:
        return os.path.normpath(run / p[len(RUN_MARK):]) if p.startswith(RUN_MARK) else p

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("policy"), dict) or not isinstance(
                data.get("arms"), list) or not all(isinstance(a, dict) for a in data["arms"]):
            raise QAError(f"{path}: invalid resolved.json (not a record of `qa run`); re-run `qa run`")
        return ResolvedRecord.model_validate(_paths(data, absolute))
    except json.JSONDecodeError as exc:
        raise QAError(f"{path}: invalid resolved.json (not JSON: {exc.msg}); re-run `qa run`") from None
    except ValidationError as exc:
        err = first_error(exc)
        raise QAError(f"{path}: invalid resolved.json ({err.where_or('file')}: {err.msg}); re-run `qa run`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise QAError(f"{path}: cannot read resolved.json ({exc})") from None
