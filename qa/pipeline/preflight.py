"""Check everything a resolved run names before any work, so a mistake is one error line, not an arm crash.

`preflight(run, strict=True)` (the start of `qa run`): every arm's problem found while resolving (a model
not on this machine, no vLLM interpreter), the calibration format, the static scales an hf arm reads (a
pending calibration writes them later) and whether its kv spec fits the model's config (read alone, no
weights), a model folder's K/V scales fitted against the arm's model and refused when they are not what
they declare (qa.pipeline.scale_fit), what a served arm would refuse or ignore on every sample, a reused
baseline (checked against the earlier run, evals.run.reuse), and every vLLM arm's arguments checked by vLLM
itself in the interpreter that will run them (evals.engines.vllm.check, one child process for all arms).
With `strict=False` (the dry run) what this machine cannot check becomes a note on the arm instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evals.engines import hf
from evals.engines.base import GenerateRequest
from evals.engines.hf.args import HFEngineArgs
from evals.engines.hf.fit import check_model_fit
from evals.engines.openai_api.args import OpenAIArgs
from evals.engines.openai_api.sampling import check_sampling
from evals.engines.vllm.args import VllmEngineArgs, check_offline_flags, engine_kwargs, is_gpu_spec
from evals.engines.vllm.check import ArmCheck, check_with_vllm
from evals.engines.vllm.kv.spec import architecture_refusal
from evals.errors import EngineError
from evals.records.arm_file import ArmManifest
from evals.run.reuse import check_reuse
from evals.servers.commands import kv_plugin_env, vllm_server_command
from evals.servers.spec import VllmServerSpec
from qa.pipeline.resolved_run import ResolvedArm, ResolvedRun, arm_tasks
from qa.pipeline.scale_fit import fit_scale_folders
from quant.fileio import scales_paths
from quant.formats.catalog import check_format_name
from quant.kv.spec import kv_spec_to_json

NO_VLLM = ("vLLM arguments not checked: vllm is not installed here, in .venv-vllm or at QA_VLLM_PYTHON "
           "(scripts/setup.sh --vllm)")


@dataclass(frozen=True)
class Preflight:
    """What the checks found: notes per arm (what vLLM said, what could not be checked here) and the
    checked manifest of a reused baseline (None: the baseline runs)."""

    notes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    reused: ArmManifest | None = None


def offline_kwargs(run: ResolvedRun, arm: ResolvedArm) -> dict[str, object]:
    """The keywords `vllm.LLM` gets for an offline vLLM arm, model included (a GPU spec as a GPU builds them)."""
    args = arm.engine_args
    assert isinstance(args, VllmEngineArgs)  # callers check first
    try:
        check_offline_flags(args.flags())
    except EngineError as exc:
        raise EngineError(f"arm {arm.name!r}: {exc}") from None
    kwargs = engine_kwargs(arm.record.load, args, on_cpu=False if is_gpu_spec(args.flags()) else None)
    model = arm.model.load_id if arm.model is not None and arm.record.load == arm.record.model else arm.record.load
    return {"model": model, **kwargs}


def vllm_checks(run: ResolvedRun) -> list[ArmCheck]:
    """What vLLM is asked about each vLLM arm: a server's command line, an offline arm's LLM keywords."""
    checks: list[ArmCheck] = []
    for arm in run.arms:
        spec = run.spec.arms[arm.name]
        if isinstance(arm.server, VllmServerSpec) and spec.server is not None:
            kv_plugin_env(arm.server)  # EngineError for an env that switches the plugin on, before any arm
            argv = vllm_server_command(arm.server, 0)[3:]  # after `python -m MODULE`; port 0 stands for a free one
            checks.append(ArmCheck(arm=arm.name, kind="server", argv=argv, env=dict(arm.record.env),
                                   gpu_spec=is_gpu_spec(spec.server.args),
                                   kv=kv_spec_to_json(arm.server.kv) if arm.server.kv is not None else None))
        elif isinstance(arm.engine_args, VllmEngineArgs):
            checks.append(ArmCheck(arm=arm.name, kind="offline", kwargs=offline_kwargs(run, arm),  # type: ignore[arg-type]
                                   env=dict(arm.record.env), gpu_spec=is_gpu_spec(arm.engine_args.flags()),
                                   allow_unsupported_kv_cache_dtype=arm.engine_args.allow_unsupported_kv_cache_dtype,
                                   kv=(kv_spec_to_json(arm.engine_args.kv)
                                       if arm.engine_args.kv is not None else None)))
    return checks


def check_vllm(run: ResolvedRun, strict: bool) -> dict[str, tuple[str, ...]]:
    """vLLM's own verdict on every vLLM arm, as notes; EngineError on the first refusal (and, `strict`, when
    vLLM is not installed)."""
    checks = vllm_checks(run)
    if not checks:
        return {}
    python = next((a.record.python for a in run.arms if a.engine_args is not None
                   and isinstance(a.engine_args, VllmEngineArgs) and a.record.python), None)
    python = python or next((s.python for a in run.arms if isinstance(s := a.server, VllmServerSpec)
                             and a.problem is None), None)
    if python is None:
        if strict:
            raise EngineError(next(a.problem for a in run.arms if a.problem) or NO_VLLM)
        return {c.arm: (NO_VLLM,) for c in checks}
    report = check_with_vllm(checks, python)
    report.raise_first()
    return {o.arm: (f"arguments checked by vLLM {report.vllm} ({python})", *o.notes) for o in report.outcomes}


def check_served_requests(run: ResolvedRun) -> None:
    """Refuse, before anything runs, what a served arm would refuse or ignore on every sample: a scoring
    task on a chat endpoint, a sampling key its kind of server ignores, and (a vLLM server `qa run`
    starts) more stop strings than its VLLM_MAX_STOP_STRINGS. A server of unknown kind is checked when the
    arm starts (the kind is read from GET /models)."""
    for arm in run.arms:
        args = arm.engine_args
        if not isinstance(args, OpenAIArgs):
            continue
        server = run.spec.arms[arm.name].server
        kind = args.server_kind or (server.kind if server is not None else None)
        for t in run.tasks:
            req = t.first_request
            if t.task.kind != "generate":
                if args.api == "chat":
                    raise EngineError(f"arm {arm.name!r}, task {t.name}: a chat endpoint cannot score given text "
                                      f"({t.task.kind}); use api = \"completions\" for this arm")
                continue
            if not isinstance(req, GenerateRequest) or kind is None:
                continue
            try:
                check_sampling(kind, args.api, [req], f"arm {arm.name!r}'s server")
            except EngineError as exc:
                raise EngineError(f"task {t.name}: {exc}") from None
            limit = arm.record.env.get("VLLM_MAX_STOP_STRINGS", "4")
            if server is not None and kind == "vllm" and limit.isdigit() and len(req.until) > int(limit):
                raise EngineError(f"arm {arm.name!r}, task {t.name}: {len(req.until)} stop strings, but a vLLM server "
                                  f"takes VLLM_MAX_STOP_STRINGS = {limit}; set env = {{ VLLM_MAX_STOP_STRINGS = "
                                  f"\"{len(req.until)}\" }} on the arm")


def check_hf_args(run: ResolvedRun) -> None:
    """Every hf arm's static scales file reads (one that the calibration step writes later is not read yet)
    and its kv spec fits its model's config (evals.engines.hf.fit: layer types, the prefix cache's windows)."""
    pending = not all(p.exists() for p in scales_paths(run.rd.scales))
    for arm in run.arms:
        if isinstance(arm.engine_args, HFEngineArgs):
            named = arm.engine_args.scales_source
            hf.check_args(arm.engine_args, load_scales=not (pending and named is not None
                                                             and Path(named) == run.rd.scales))
            if arm.model is not None:
                check_model_fit(arm.model, arm.engine_args)


def model_config_json(arm: ResolvedArm) -> Path | None:
    """The arm's model's config.json on this machine (its folder, or the hub cache), None when not here."""
    if arm.model is None:
        return None
    if arm.model.path is not None:
        return arm.model.path / "config.json"
    from huggingface_hub import try_to_load_from_cache  # huggingface_hub: only to find a cached hub config

    found = try_to_load_from_cache(str(arm.model.hub_id), "config.json")
    return Path(found) if isinstance(found, str) else None


def check_kv_architectures(run: ResolvedRun, strict: bool) -> dict[str, tuple[str, ...]]:
    """Refuse (EngineError) a vLLM arm with a kv table whose model the qa_kv plugin cannot rewrite, from its
    config.json alone (evals.engines.vllm.kv.spec.architecture_refusal); a note where it is not here."""
    notes: dict[str, tuple[str, ...]] = {}
    for arm in run.arms:
        served = isinstance(arm.server, VllmServerSpec) and arm.server.kv is not None
        if not served and not (isinstance(arm.engine_args, VllmEngineArgs) and arm.engine_args.kv is not None):
            continue
        path = model_config_json(arm)
        if path is None or not path.is_file():
            if strict:
                continue  # the arm's own problem (a model not here) is raised first; the plugin checks at load
            notes[arm.name] = ("model architecture not checked against the qa_kv plugin: no config.json here",)
            continue
        why = architecture_refusal(path)
        if why is not None:
            raise EngineError(f"arm {arm.name!r}: kv cache spec: {why}")
    return notes


def check_reused_baseline(run: ResolvedRun) -> ArmManifest | None:
    """For a baseline with `from` (an earlier run directory): the checked manifest of its records to copy
    (evals.run.reuse; RecordError naming the first mismatch), else None. Writes nothing."""
    base = run.arm("baseline")
    if base.record.reused_from is None:
        return None
    return check_reuse(run.config(base), arm_tasks(run.record), Path(base.record.reused_from))


def preflight(run: ResolvedRun, *, strict: bool = True) -> Preflight:
    """Run every check of the module doc; the first failure raises its one-line error."""
    if run.record.calibration is not None:
        check_format_name(run.record.calibration.step.format, profile_formats=False)
    notes: dict[str, tuple[str, ...]] = {}
    for arm in run.arms:
        if arm.problem is not None and strict:
            raise EngineError(arm.problem)
    check_hf_args(run)
    fits = fit_scale_folders(run, strict=strict)  # a folder's K/V scales, fitted and refused before any arm
    check_served_requests(run)
    notes.update(check_kv_architectures(run, strict))  # from config.json, before vLLM is asked anything
    for name, lines in check_vllm(run, strict).items():
        notes[name] = (*notes.get(name, ()), *lines)
    for name, lines in fits.items():
        notes[name] = (*notes.get(name, ()), *lines)
    for arm in run.arms:
        if arm.problem is not None and not strict:
            notes[arm.name] = (*notes.get(arm.name, ()), f"not runnable here: {arm.problem}")
    return Preflight(notes=notes, reused=check_reused_baseline(run) if strict else None)
