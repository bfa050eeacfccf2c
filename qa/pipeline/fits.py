"""Every item of every task against each arm's context window, before any arm starts (evals.run.context_fit), counted
with the model's tokenizer. The window is the arm's own limit (hf `max_length`, vLLM `max_model_len`), for an
`openai` arm with a server `qa run` starts the server's (vLLM's `max_model_len` in its args, llama.cpp's
`n_ctx` shared by its `n_parallel` slots), else the model's config. An `openai` arm pointed at an external
server has a window this machine cannot know: a warning line says so. An arm whose model is not a local folder
(a hub id, an lm-eval folder) is checked by its engine when it runs. Arms sharing a model folder and window are
checked once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.engines.hf.args import HFEngineArgs
from evals.engines.hf.fit import context_window
from evals.engines.openai_api.args import OpenAIArgs
from evals.engines.vllm.args import VllmEngineArgs
from evals.errors import ModelError, one_line
from evals.models.config import read_model_config
from evals.run.context_fit import check_fit
from evals.servers.spec import LlamaCppServerSpec, VllmServerSpec
from qa.pipeline.resolved_run import ResolvedArm, ResolvedRun


@dataclass(frozen=True)
class ArmWindow:
    """Where an arm's items are counted: the model folder (its tokenizer, its config), the window the arm sets
    (None: the config's), and how a message names it."""

    folder: Path
    limit: int | None
    where: str


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def arm_limit(arm: ResolvedArm) -> int | None:
    """The window the arm's engine arguments or its server set (hf max_length, vLLM max_model_len, llama.cpp n_ctx
    per slot), else None."""
    args, server = arm.engine_args, arm.server
    if isinstance(args, HFEngineArgs):
        return args.max_length
    if isinstance(args, VllmEngineArgs):
        return _int(args.flags().get("max_model_len"))
    if isinstance(server, LlamaCppServerSpec):
        return server.n_ctx // server.n_parallel  # llama.cpp splits n_ctx among its slots (kv_unified off)
    if isinstance(server, VllmServerSpec):
        return _int(server.args.get("max_model_len"))
    return None


def _served_by(arm: ResolvedArm) -> str:
    server = arm.server
    if isinstance(server, LlamaCppServerSpec):
        slots = f" over {server.n_parallel} slots" if server.n_parallel > 1 else ""
        return f" on llama.cpp's server, n_ctx {server.n_ctx}{slots}"
    if isinstance(server, VllmServerSpec):
        return " on vLLM's server" + (f", max_model_len {arm_limit(arm)}" if arm_limit(arm) else "")
    return ""


@dataclass(frozen=True)
class UnknownWindow:
    """Why an arm's window cannot be known here: what serves it, and what that leaves unchecked."""

    subject: str
    why: str


def arm_window(arm: ResolvedArm) -> ArmWindow | UnknownWindow | None:
    """Where the arm's items are counted; why its window cannot be known here (an `openai` arm on an external
    server, or on a server of a model that is not a local folder); None when its engine checks them (no engine
    runs here, or its model is a hub id)."""
    if not arm.record.runs:
        return None
    args = arm.engine_args
    folder = arm.model.path if arm.model is not None else None
    if isinstance(args, OpenAIArgs) and arm.server is None:
        urls = ", ".join(args.base_urls or ((args.base_url,) if args.base_url else ()))
        return UnknownWindow(f"openai at {urls or 'no base_url'}", "the context window of an external server is "
                             "unknown here, so items are not checked against it before the run")
    if isinstance(args, OpenAIArgs) and folder is None:
        return UnknownWindow(f"{arm.record.model}{_served_by(arm)}", "the model is not a local folder whose "
                             "tokenizer could count items, so they are not checked against the server's window "
                             "before the run")
    if not isinstance(args, HFEngineArgs | VllmEngineArgs | OpenAIArgs) or folder is None:
        return None
    return ArmWindow(folder, arm_limit(arm), f"arm {arm.name!r} ({arm.record.model}{_served_by(arm)})")


def _tokenizer(path: Path, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer  # transformers: only for a run with a local model folder

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - a missing or broken tokenizer file is bad input
        raise ModelError(f"model folder {path}: cannot load its tokenizer: {one_line(exc)[:400]}") from None


def check_local_folders(run: ResolvedRun) -> None:
    """ModelError (one line) for a local model folder an arm names that did not resolve (a broken config.json; the
    error kept when the run was resolved): bad input even in a dry run, where a model this machine lacks is only
    a note."""
    for arm in run.arms:
        if arm.model_error is not None and Path(arm.record.model).expanduser().is_dir():
            raise arm.model_error


def check_items_fit(run: ResolvedRun) -> list[str]:
    """Every item against each arm's window: EvalError (one line) for a task built to a context length or a
    session task whose item does not fit (evals.run.context_fit); a warning line per other task with items that do
    not, and one per reason a window is unknown here, naming its arms."""
    check_local_folders(run)
    warnings: list[str] = []
    unknown: dict[UnknownWindow, list[str]] = {}  # -> the arms it is unknown for (one line each)
    seen: set[tuple[Path, int | None]] = set()
    for arm in run.arms:
        found = arm_window(arm) if run.tasks else None
        if isinstance(found, UnknownWindow):
            unknown.setdefault(found, []).append(repr(arm.name))
        if not isinstance(found, ArmWindow) or (found.folder, found.limit) in seen:
            continue
        seen.add((found.folder, found.limit))
        trust = run.record.trust_remote_code
        config = read_model_config(found.folder, trust_remote_code=trust)
        tokenizer = _tokenizer(found.folder, trust)
        window = found.limit or context_window(config, tokenizer)
        for t in run.tasks:
            line = check_fit(t.task, t.selection, run.seed, tokenizer.encode, window, found.where)
            warnings += [line] if line is not None else []
    return [f"arm{'s' if len(arms) > 1 else ''} {', '.join(arms)} ({u.subject}): {u.why}"
            for u, arms in unknown.items()] + warnings
