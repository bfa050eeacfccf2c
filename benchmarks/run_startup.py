"""What `qa run` does in its own process before the first child starts: wall time and repeated work.

    python -m benchmarks.run_startup [SPEC ...] [--data-dir DIR] [--repeat N]

For each spec (default: the README's main job, examples/smollm2_nvfp4_kv.toml) `qa run SPEC --out TMP` runs
in this process into a fresh temporary folder and is stopped when it starts its first arm's worker: nothing
below that point runs. A calibration step before it runs for real, in its own child as always, and its wall
time is left out of the parent's. Printed side by side:

- the parent's seconds from calling the CLI to the first arm's worker (best of --repeat runs, no profiler
  attached; a calibration child's time subtracted), and
- in a separate run under a call counter (sys.setprofile, by code object, so it counts calls however a
  function was imported): how often the parent read each dataset split (`evals.data.load`), built each task
  (a task module's `build`), parsed a spec or a policy, parsed engine arguments and resolved a model.

The counts are the measure of "resolved once": each should be 1 per task, spec and policy (a model per arm).
"""

from __future__ import annotations

import argparse
import inspect
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from evals.data import load as load_data
from evals.engines import parse_engine_args
from evals.models.resolve import resolve_model
from qa.cli.main import main as qa_main
from qa.files.policy import parse_policy
from qa.files.spec import parse_spec

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = ROOT / "examples" / "smollm2_nvfp4_kv.toml"
# the code object of each counted function -> label of what is counted
COUNTED: dict[CodeType, str] = {inspect.unwrap(fn).__code__: label for fn, label in (
    (load_data, "data read"), (parse_spec, "spec parsed"), (parse_policy, "policy parsed"),
    (parse_engine_args, "engine args parsed"), (resolve_model, "model resolved"))}


STEPS = ("calibrate", "kv-inspect")  # worker roles that are not arms: run for real


class FirstArm(BaseException):
    """Raised where `qa run` would start its first arm's worker (not an Exception: the CLI turns those
    into one error line)."""


def _stop_at_arm(real: Callable[..., Any], child_seconds: list[float]) -> Callable[..., Any]:
    def start(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(cmd, list | tuple) and "qa.pipeline.worker" in map(str, cmd):
            role = str(cmd[4])  # python -m qa.pipeline.worker RUN ROLE
            if role not in STEPS:
                raise FirstArm(f"qa.pipeline.worker {role}")
            t0 = time.perf_counter()
            try:
                return real(cmd, *args, **kwargs)
            finally:
                child_seconds.append(time.perf_counter() - t0)
        return real(cmd, *args, **kwargs)
    return start


def _run_until_child(spec: Path, data_dir: Path | None) -> tuple[float, str]:
    """The parent's seconds from the CLI call to its first arm's worker, and that worker's `MODULE ROLE`."""
    real_run, real_popen = subprocess.run, subprocess.Popen
    steps: list[float] = []
    subprocess.run = _stop_at_arm(real_run, steps)  # type: ignore[assignment]
    subprocess.Popen = _stop_at_arm(real_popen, steps)  # type: ignore[assignment,misc]
    out = Path(tempfile.mkdtemp(prefix="qa-startup-")) / "run"
    argv = ["run", str(spec), "--out", str(out)] + (["--data-dir", str(data_dir)] if data_dir else [])
    start = time.perf_counter()
    try:
        qa_main(argv)
    except FirstArm as child:
        return time.perf_counter() - start - sum(steps), str(child)
    except SystemExit as exc:
        raise SystemExit(f"qa run {spec} ended (exit {exc.code}) before starting an arm") from None
    finally:
        subprocess.run, subprocess.Popen = real_run, real_popen  # type: ignore[assignment,misc]
    raise SystemExit(f"qa run {spec} returned before starting an arm")


def _counting(spec: Path, data_dir: Path | None) -> Counter[str]:
    """Calls of the COUNTED functions (and of each task module's build) in this process, to the first arm."""
    counts: Counter[str] = Counter()
    root = str(ROOT) + os.sep

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith(root):
            return
        rel = code.co_filename[len(root):].replace(os.sep, "/")
        label = COUNTED.get(code)
        if label == "data read":
            label = f"data read: {frame.f_locals.get('name')}/{frame.f_locals.get('split') or 'eval'}"
        elif label is None and rel.startswith("evals/tasks/") and code.co_name == "build":
            label = f"task built: {frame.f_locals.get('name')}"
        if label is not None:
            counts[label] += 1

    sys.setprofile(profile)
    try:
        _run_until_child(spec, data_dir)
    finally:
        sys.setprofile(None)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", type=Path, default=[DEFAULT_SPEC])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.repeat < 1:
        print("error: --repeat must be >= 1", file=sys.stderr)
        return 2
    for spec in args.specs:
        if not spec.is_file():
            print(f"error: {spec}: no such spec file", file=sys.stderr)
            return 2
        counts = _counting(spec, args.data_dir)  # also warms imports and caches, as the timed runs see them
        times, child = [], ""
        for _ in range(args.repeat):
            seconds, child = _run_until_child(spec, args.data_dir)
            times.append(seconds)
        print(f"{spec}: first arm `{child}` after {min(times):.2f} s (best of {args.repeat}: "
              f"{', '.join(f'{t:.2f}' for t in times)})")
        for label in sorted(counts):
            print(f"  {counts[label]:3d}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
