"""Child process of `qa run`: runs one arm (or the calibration step) of a run directory.

    python -m qa.arm_worker RUN_DIR {baseline|candidate|rerun|calibrate} [--data-dir DIR]

Each arm runs in its own process so that engines never share memory, threads or global state,
and so that a vLLM arm can use its own interpreter. Reads only `RUN_DIR/spec.toml`; writes only
`RUN_DIR/records/<arm>/` (or `RUN_DIR/calibration/`). User errors: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from qa.errors import USER_ERRORS
from qa.logs import quiet_third_party_logs
from qa.rundir import load_run_spec
from qa.spec import RunSpec


def run_arm(spec: RunSpec, run_dir: Path, role: str, data_dir: Path | None) -> None:
    """Build the arm's engine once and run every task of the spec into records/<role>/."""
    from evals.arm import ArmConfig, TaskSpec
    from evals.arm import run_arm as run_evals_arm
    from qa.arm_server import arm_server
    from qa.pipeline import _task_options, resolved_engine_args

    arm = spec.arms[role]  # type: ignore[index]
    tasks = [TaskSpec(t.name, _task_options(t), t.limit, t.repeats) for t in spec.tasks]
    with arm_server(spec, role, run_dir) as base_url:  # type: ignore[arg-type]
        args = resolved_engine_args(spec, role, run_dir)  # type: ignore[arg-type]
        if base_url is not None:
            args["base_url"] = base_url
        config = ArmConfig(
            name=role,
            engine=arm.engine,
            model=spec.arm_model(role),  # type: ignore[arg-type]
            engine_args=args,
            server=arm.server.model_dump() if arm.server is not None else None,
            seed=spec.seed,
            data_dir=data_dir,
        )
        run_evals_arm(config, tasks, run_dir)


def calibrate(spec: RunSpec, run_dir: Path, data_dir: Path | None) -> None:
    """Calibrate static KV scales for the candidate into calibration/."""
    from qa.calibration import calibrate_for_run

    calibrate_for_run(spec, run_dir, data_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qa.arm_worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("role", choices=["baseline", "candidate", "rerun", "calibrate"])
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    quiet_third_party_logs()
    try:
        spec = load_run_spec(args.run_dir)
        if args.role == "calibrate":
            calibrate(spec, args.run_dir, args.data_dir)
        else:
            if args.role not in spec.arms:
                print(f"error: the spec has no arm {args.role!r}", file=sys.stderr)
                return 2
            run_arm(spec, args.run_dir, args.role, args.data_dir)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
