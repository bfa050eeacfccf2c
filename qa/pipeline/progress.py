"""What `qa run` says about the work ahead: the planned items of each arm (the run's header), the run's length
from the first items' rate (asked of the first arm's process: evals.run.progress QA_PROGRESS_RUN), and after the
first arm the run's length at its rate. Each arm's own progress lines or bars: evals.run.progress."""

from __future__ import annotations

from evals.run.progress import RUN_ENV, clock
from qa.files.resolved_json import ArmRecord
from qa.pipeline.resolved_run import ResolvedArm, ResolvedRun


def running_arms(run: ResolvedRun) -> list[ResolvedArm]:
    """The arms that run an engine in this run (a reused baseline runs none)."""
    return [a for a in run.arms if a.record.runs]


def planned_lines(run: ResolvedRun) -> list[str]:
    """The run's header: the items (x repeats) each running arm plans per task, and its total samples."""
    arms = running_arms(run)
    if not arms or not run.tasks:
        return ["planned: no arm runs an engine (every baseline is reused)"] if not arms else []
    tasks = ", ".join(f"{t.name} {t.n_items}" + (f" x {t.repeats}" if t.repeats > 1 else "") for t in run.tasks)
    per_arm = sum(t.samples for t in run.tasks)
    lines = [(f"planned per arm: {tasks} ({per_arm} samples); arms that run: "
             f"{', '.join(a.name for a in arms)} ({per_arm * len(arms)} samples in all)")]
    if run.sequential:
        lines.append("  sequential looks: a task that decides early stops, so these are the most each arm runs")
    lines.append("  the run's length is estimated from the first items' rate (`estimate: run:`), each task's from its "
                 "first chunk, and the run's again after the first arm")
    return lines


def estimate_env(run: ResolvedRun, arm: ResolvedArm, todo: list[ResolvedArm]) -> ArmRecord:
    """The arm's record as its process is started: the first arm of `todo` (the arms left to run, in order) asks
    for the run's length from its first items' rate (the samples of every arm left); the others never do."""
    samples = sum(t.samples for t in run.tasks) * len(todo) if todo and arm is todo[0] else None
    return arm.record.model_copy(update={"env": {**arm.record.env, RUN_ENV: str(samples or "")}})


def length_estimate(arm: ResolvedArm, later: int, seconds: float) -> str | None:
    """After the first arm that ran (`seconds`): the time left for the `later` arms after it at its rate; None if
    none."""
    if later < 1:
        return None
    return (f"estimate: {arm.name} took {clock(seconds)}; the {later} arm(s) after it ~{clock(seconds * later)} "
            "more at its rate")
