"""`qa run`, step by step: preflight -> env.json -> calibrate (if asked) -> each arm in its own
process -> KV inspection (emulated-cache candidates) -> compare -> gate -> report.

Stages talk through the run directory only (`qa.rundir.RunDir`): an arm process writes
records/<arm>/*.jsonl, compare reads them and writes comparison.json, the gate writes verdict.json,
the report reads the folder. Every stage can be resumed or re-run alone; a killed run restarted with
the same command skips the samples it already finished.
"""

from __future__ import annotations

from pathlib import Path

from evals.errors import EvalError
from qa.arm_inputs import emulated_kv, resolved_engine_args
from qa.comparison import Comparison, StatsSettings
from qa.errors import SpecError
from qa.gate.verdict import Verdict
from qa.processes import calibrate_step, kv_inspect_step, run_arm_process
from qa.rundir import RunDir, prepare_run_dir
from qa.spec import ArmRole, RunSpec


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
    collect_env(model_hashes=models, data_hashes=data).write(rd.env)


def preflight(spec: RunSpec, rd: RunDir, data_dir: Path | None, spec_dir: Path | None) -> None:
    """Check everything a run names before any work (policy, tasks and their data, models, KV and
    engine arguments, calibration format), so a mistake is one error line, not an arm crash later."""
    from evals.models import resolve_model
    from qa.arm_server import server_spec
    from qa.dry_run import dry_run
    from qa.policy import resolve_policy
    from quant.formats import get_format
    from quant.scales import scales_paths

    resolve_policy(spec.policy, spec_dir)
    dry_run(spec, data_dir, rd.root)  # every task by name, its data files read
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


def compare_step(spec: RunSpec, rd: RunDir) -> Comparison:
    """Pair the arms' records and write comparison.json."""
    from qa.api import compare

    rerun = arm_source(spec, "rerun", rd) if "rerun" in spec.arms else None
    return compare(arm_source(spec, "baseline", rd), arm_source(spec, "candidate", rd), rd.root,
                   StatsSettings(seed=spec.seed), rerun=rerun)


def gate_and_report(spec: RunSpec, rd: RunDir, spec_dir: Path | None) -> Verdict:
    """Gate comparison.json under the spec's policy (verdict.json), then write the reports."""
    from qa.api import gate, report
    from qa.policy import resolve_policy

    policy = resolve_policy(spec.policy, spec_dir)
    verdict = gate(rd.root, policy)
    report(rd.root)
    return verdict


def run(spec: RunSpec, run_dir: Path, *, data_dir: Path | None, spec_dir: Path | None) -> Verdict:
    """The whole pipeline into `run_dir` (resuming a run of the same spec)."""
    if not spec.tasks and any(a.engine != "lmeval" for a in spec.arms.values()):
        raise SpecError("the spec names no tasks")
    rd = prepare_run_dir(spec, run_dir, check_only=True)
    preflight(spec, rd, data_dir, spec_dir)
    prepare_run_dir(spec, run_dir)
    if not rd.env.exists():
        write_env_json(spec, rd, data_dir)
    if spec.calibration is not None:
        calibrate_step(run_dir, data_dir)
    for role, arm in spec.arms.items():
        if arm.engine != "lmeval":
            run_arm_process(run_dir, role, spec, data_dir)
    if emulated_kv(spec, "candidate") is not None:
        kv_inspect_step(run_dir, data_dir)
    compare_step(spec, rd)
    return gate_and_report(spec, rd, spec_dir)
