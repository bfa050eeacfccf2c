"""`qa run`, step by step, on a spec resolved once (qa.pipeline.resolve): preflight -> power plan -> the run
directory (spec.toml, resolved.json, policy.toml) -> env.json -> calibrate (if asked) -> each arm in its own
process (a baseline with `from` is copied from the earlier run; an arm whose records are already complete
starts nothing) -> KV inspection (emulated-cache candidates) -> compare -> gate -> report, once per
candidate: at the run root for a run whose one candidate is named "candidate", else in candidates/<name>/
plus the run-level verdict.json, junit.xml, summary.md and matrix report (qa.steps).

Stages talk through the run directory only (`qa.files.rundir.RunDir`): an arm process writes
records/<arm>/*.jsonl, compare reads them and writes comparison.json, the gate writes verdict.json, the report
reads the folder. Every stage can be resumed or re-run alone; a killed run restarted with the same command
skips the samples it already finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from evals.data import data_file_hashes
from evals.errors import EvalError
from evals.records.env import collect_env
from evals.run.progress import settings_from_env
from evals.run.reuse import copy_reused
from evals.tasks import task_datasets
from qa.files.comparison import Comparison, StatsSettings
from qa.files.rundir import prepare_run_dir
from qa.files.verdict import RunVerdict, Verdict
from qa.pipeline.fits import check_items_fit
from qa.pipeline.preflight import Preflight, preflight
from qa.pipeline.processes import run_arm_process, run_step
from qa.pipeline.progress import estimate_env, length_estimate, planned_lines, running_arms
from qa.pipeline.resolved_run import ResolvedArm, ResolvedRun
from qa.pipeline.resume import arm_complete
from qa.pipeline.sequential import run_sequential
from qa.plan.power import PlanOptions, RunPlan, announce_plan, plan_run
from qa.steps import Arms, compare_folders, gate_candidates, gate_folder, report_candidates, report_folder
from quant.fileio import scales_paths


@dataclass(frozen=True)
class Started:
    """What the checks before any work found: the preflight's notes and reused baseline, the power plan."""

    checks: Preflight
    plan: RunPlan


def write_env_json(run: ResolvedRun) -> None:
    """env.json: versions, git sha, hardware, model and data file hashes (the models resolved once)."""
    models = {a.record.model: a.model.file_hash if a.model is not None else None
              for a in run.arms if a.record.engine in ("hf", "vllm")}
    try:
        data = data_file_hashes(task_datasets(t.name for t in run.tasks), run.data_dir)
    except EvalError:
        data = {}
    collect_env(model_hashes=models, data_hashes=data,
                arm_env={a.name: a.record.env for a in run.arms}).write(run.rd.env)


def start(run: ResolvedRun, options: PlanOptions | None = None, *, strict: bool = True) -> Started:
    """Check the resolved run and plan it, before anything is written (preflight, then the power plan;
    PlanError under its strict flag)."""
    if strict:
        prepare_run_dir(run.spec, run.rd.root, check_only=True)  # another run's folder: refused before any work
    settings_from_env()  # a bad QA_PROGRESS* variable is refused before any work, not when an arm starts
    checks = preflight(run, strict=strict)
    for line in check_items_fit(run):  # every item against each arm's context window (a dry run too)
        print(f"warning: {line}", flush=True)
    return Started(checks, plan_run(run.tasks, run.policy.policy, run.spec.model, options))


def compare_step(run: ResolvedRun, cand: ResolvedArm) -> Comparison:
    """Pair the baseline's and one candidate's records (the rerun as the floor) and write comparison.json."""
    rerun = next((a for a in run.arms if a.record.kind == "rerun"), None)
    arms = Arms(run.records_of(run.arm("baseline")), run.records_of(cand),
                run.records_of(rerun) if rerun is not None else None)
    return compare_folders(arms, run.out(cand).root, StatsSettings(seed=run.seed))


def gate_and_report(run: ResolvedRun) -> Verdict | RunVerdict:
    """Gate each candidate's comparison.json under the resolved policy (verdict.json), then write the
    reports; a several-candidate run also gets its run-level verdict and matrix report."""
    policy = run.policy.policy
    if [a.record.out for a in run.candidates] == ["."]:
        verdict = gate_folder(run.rd.root, policy)
        report_folder(run.rd.root)
        return verdict
    combined, _ = gate_candidates(run.rd.root, policy)
    report_candidates(run.rd.root)
    return combined


def calibrate(run: ResolvedRun) -> None:
    """Calibrate the candidates' static KV scales once (skipped when the scales and the vLLM folder they
    feed, if any, are written)."""
    cal = run.record.calibration
    if cal is None:
        return
    done = all(p.exists() for p in scales_paths(run.rd.root / cal.scales))  # a kill may leave only one
    if done and (cal.vllm_model is None or (run.rd.root / cal.vllm_model / "config.json").is_file()):
        return
    st = cal.step
    print(f"calibration: {st.n_samples} x {st.seq_len} tokens of {st.dataset}, {st.observer} observer, "
          f"{st.format} scales for arm {cal.arm!r}: started", flush=True)  # minutes on a CPU: say so in a CI log
    t0 = time.monotonic()
    run_step(run.rd.root, "calibrate", "calibration")
    print(f"calibration: done in {time.monotonic() - t0:.0f} s", flush=True)


def run_arms(run: ResolvedRun) -> None:
    """Each arm that runs an engine and is not complete yet, in its own process (fixed n); the first one prints
    the run's length from its first items' rate, and after it the run's length at its rate."""
    arms = running_arms(run)
    complete = {a.name for a in arms if arm_complete(run, a)}
    todo = [a for a in arms if a.name not in complete]
    for arm in arms:
        if arm.name in complete:
            print(f"{arm.name}: every record is on disk; nothing to run", flush=True)
            continue
        began = time.perf_counter()
        run_arm_process(run.rd.root, estimate_env(run, arm, todo))
        if arm is todo[0] and (line := length_estimate(arm, len(todo) - 1, time.perf_counter() - began)):
            print(line, flush=True)


def inspect_kv(run: ResolvedRun) -> None:
    """kv_inspect.json of each emulated-cache candidate that has none (one worker for all)."""
    if any(a.kv is not None and not run.out(a).kv_inspect.exists() for a in run.candidates):
        run_step(run.rd.root, "kv-inspect", "the KV-cache inspection")


def run(run: ResolvedRun, options: PlanOptions | None = None) -> Verdict | RunVerdict:
    """The whole pipeline into the resolved run directory (resuming a run of the same spec); the power plan
    is printed before anything is written."""
    started = start(run, options)
    announce_plan(started.plan, options.strict if options is not None else False)
    for line in planned_lines(run):
        print(line, flush=True)
    prepare_run_dir(run.spec, run.rd.root)
    run.rd.save_resolved(run.record, run.policy.text)
    if not run.rd.env.exists():
        write_env_json(run)
    calibrate(run)
    if started.checks.reused is not None:
        copy_reused(started.checks.reused, run.rd.root)  # no baseline engine starts; checked each run
    if run.sequential:  # the arms advance together in blocks, a look after each; writes each comparison.json
        run_sequential(run)
    else:
        run_arms(run)
    inspect_kv(run)
    if not run.sequential:
        for cand in run.candidates:
            compare_step(run, cand)
    return gate_and_report(run)
