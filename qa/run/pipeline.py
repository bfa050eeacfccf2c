"""`qa run`, step by step: preflight -> env.json -> calibrate (if asked) -> each arm in its own
process (a baseline with `from` is copied from the earlier run instead, when it matches) -> KV
inspection (emulated-cache candidates) -> compare -> gate -> report, once per candidate: at the run
root for a run whose one candidate is named "candidate", else in candidates/<name>/ plus the
run-level verdict.json, junit.xml, summary.md and matrix report (qa.api.gate_candidates).

Stages talk through the run directory only (`qa.files.rundir.RunDir`): an arm process writes
records/<arm>/*.jsonl, compare reads them and writes comparison.json, the gate writes verdict.json,
the report reads the folder. Every stage can be resumed or re-run alone; a killed run restarted with
the same command skips the samples it already finished.
"""

from __future__ import annotations

from pathlib import Path

from evals.arm import ArmManifest
from evals.arm_reuse import copy_reused
from evals.errors import EvalError
from qa.run.arm_inputs import emulated_kv, resolved_engine_args
from qa.files.comparison import Comparison, StatsSettings
from qa.errors import SpecError
from qa.files.verdict import RunVerdict, Verdict
from qa.plan.power import PlanOptions, announce_plan
from qa.run.processes import calibrate_step, kv_inspect_step, run_arm_process
from qa.files.rundir import RunDir, prepare_run_dir
from qa.files.spec import ArmRole, RunSpec


def resolve_data_dir(spec: RunSpec, override: Path | None) -> Path | None:
    """The data folder: --data-dir, else the spec's data_dir, else $QA_DATA_DIR (else the hub)."""
    from evals.data import resolve_data_dir as resolve

    return resolve(override or spec.data_dir)


def arm_source(spec: RunSpec, role: ArmRole, rd: RunDir) -> Path:
    """Where an arm's records are: records/<arm>/, or an lm-eval arm's --log_samples folder."""
    arm = spec.arms[role]
    return Path(arm.lmeval_dir) if arm.engine == "lmeval" and arm.lmeval_dir else rd.arm_records(role)


def write_env_json(spec: RunSpec, rd: RunDir, data_dir: Path | None) -> None:
    """env.json: versions, git sha, hardware, model and data file hashes."""
    from evals.data import data_file_hashes
    from evals.env import collect_env
    from evals.models import resolve_model

    models: dict[str, str | None] = {}
    for role, arm in spec.arms.items():
        if arm.engine in ("hf", "vllm"):
            try:
                models[spec.arm_model(role)] = resolve_model(spec.arm_model(role)).file_hash
            except EvalError:
                models[spec.arm_model(role)] = None
    try:
        data = data_file_hashes([t.name for t in spec.tasks], data_dir) if data_dir is not None else {}
    except EvalError:
        data = {}
    collect_env(model_hashes=models, data_hashes=data,
                arm_env={role: arm.env for role, arm in spec.arms.items()}).write(rd.env)


def preflight(spec: RunSpec, rd: RunDir, data_dir: Path | None, spec_dir: Path | None) -> None:
    """Check everything a run names before any work (policy, tasks and their data, models, KV and
    engine arguments, calibration format), so a mistake is one error line, not an arm crash later."""
    from evals.models import resolve_model
    from qa.run.servers import server_spec
    from qa.run.dry_run import dry_run
    from qa.files.policy import resolve_policy
    from quant.formats import get_format
    from quant.scales import scales_paths

    resolve_policy(spec.policy, spec_dir)
    dry_run(spec, data_dir, rd.root, require_vllm=True)  # every task and its data; vLLM arms checked by vLLM
    if spec.calibration is not None:
        get_format(spec.calibration.format)
    for role, arm in spec.arms.items():
        if arm.engine in ("hf", "vllm"):
            resolve_model(spec.arm_model(role))
        if arm.server is not None:
            server_spec(spec, role)  # model files and cache types checked; nothing started
        if arm.engine == "hf":
            from evals.engines.hf import check_args
            from evals.engines.hf.args import HFEngineArgs

            args = resolved_engine_args(spec, role, rd)
            assert isinstance(args, HFEngineArgs)  # parsed for the hf engine
            done = all(p.exists() for p in scales_paths(rd.scales))
            pending = args.scales == rd.scales and not done
            check_args(args, load_scales=not pending)  # the calibration step writes pending scales


def candidate_dir(spec: RunSpec, rd: RunDir, name: str) -> RunDir:
    """Where a candidate's comparison, verdict and report go: the run root, or candidates/<name>/."""
    return rd.candidate(name) if spec.per_candidate_dirs else rd


def compare_step(spec: RunSpec, rd: RunDir, name: str = "candidate") -> Comparison:
    """Pair the baseline's and one candidate's records (the rerun as the floor) and write comparison.json."""
    from qa.api import compare

    rerun = arm_source(spec, "rerun", rd) if "rerun" in spec.arms else None
    return compare(arm_source(spec, "baseline", rd), arm_source(spec, name, rd), candidate_dir(spec, rd, name).root,
                   StatsSettings(seed=spec.seed), rerun=rerun)


def gate_and_report(spec: RunSpec, rd: RunDir, spec_dir: Path | None) -> Verdict | RunVerdict:
    """Gate each candidate's comparison.json under the spec's policy (verdict.json), then write the
    reports; a several-candidate run also gets its run-level verdict and matrix report."""
    from qa.api import gate, gate_candidates, report, report_candidates
    from qa.files.policy import resolve_policy

    policy = resolve_policy(spec.policy, spec_dir)
    if not spec.per_candidate_dirs:
        verdict = gate(rd.root, policy)
        report(rd.root)
        return verdict
    run_verdict, _ = gate_candidates(rd.root, policy)
    report_candidates(rd.root)
    return run_verdict


def check_reused_baseline(spec: RunSpec, rd: RunDir, data_dir: Path | None) -> ArmManifest | None:
    """For a baseline with `from` (an earlier run directory, relative to the working directory): the
    checked manifest of its records to copy (evals.arm_reuse; RecordError naming the first mismatch),
    else None. Writes nothing."""
    from evals.arm_reuse import check_reuse
    from qa.run.arm_inputs import arm_config, arm_tasks

    source = spec.arms["baseline"].from_run
    if source is None:
        return None
    return check_reuse(arm_config(spec, "baseline", rd, data_dir), arm_tasks(spec), Path(source))


def run(spec: RunSpec, run_dir: Path, *, data_dir: Path | None, spec_dir: Path | None,
        plan: PlanOptions | None = None) -> Verdict | RunVerdict:
    """The whole pipeline into `run_dir` (resuming a run of the same spec); the power plan is printed
    (qa.plan.power, with `plan`'s priors; PlanError under its strict flag) before anything is written."""
    if not spec.tasks and any(a.engine != "lmeval" for a in spec.arms.values()):
        raise SpecError("the spec names no tasks")
    rd = prepare_run_dir(spec, run_dir, check_only=True)
    preflight(spec, rd, data_dir, spec_dir)
    announce_plan(spec, data_dir, spec_dir, plan)  # per task: items, margin, MDE from a prior, reachable
    reused = check_reused_baseline(spec, rd, data_dir)  # refused before anything is written
    prepare_run_dir(spec, run_dir)
    if not rd.env.exists():
        write_env_json(spec, rd, data_dir)
    if spec.calibration is not None:
        calibrate_step(run_dir, data_dir)
    if reused is not None:
        copy_reused(reused, rd.root)  # no baseline engine starts; a resumed run checks and copies again
    from qa.files.policy import resolve_policy
    from qa.run.sequential import is_sequential, run_sequential

    policy = resolve_policy(spec.policy, spec_dir)
    sequential = is_sequential(spec, policy)
    if sequential:  # the arms advance together in blocks, a look after each; writes each comparison.json
        run_sequential(spec, rd, data_dir, policy, reused=reused is not None)
    for role, arm in spec.arms.items():
        if not sequential and arm.engine != "lmeval" and not (reused is not None and role == "baseline"):
            run_arm_process(run_dir, role, spec, data_dir)
    names = [n for n in spec.candidates if emulated_kv(spec, n) is not None]
    if any(not candidate_dir(spec, rd, n).kv_inspect.exists() for n in names):
        kv_inspect_step(run_dir, data_dir)  # the worker inspects each emulated-cache candidate without one
    for name in spec.candidates:
        if not sequential:
            compare_step(spec, rd, name)
    return gate_and_report(spec, rd, spec_dir)
