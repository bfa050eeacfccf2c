"""Child process of `qa run`: one arm, the calibration step, or the KV-cache inspection of a run.

    python -m qa.worker RUN_DIR {baseline|candidate|rerun|calibrate|kv-inspect} [--data-dir DIR]

Reads only RUN_DIR/spec.toml (and calibration/ when it exists); writes only its own part:
records/<arm>/, calibration/, or kv_inspect.json. User errors: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from qa.errors import USER_ERRORS, SpecError
from qa.logs import quiet_third_party_logs
from qa.rundir import RunDir
from qa.spec import RunSpec

ROLES = ("baseline", "candidate", "rerun", "calibrate", "kv-inspect")
INSPECT_PROMPTS, INSPECT_TOKENS = 4, 256  # WikiText-2 prompts x tokens the KV inspection reads


def run_spec_arm(spec: RunSpec, rd: RunDir, role: str, data_dir: Path | None) -> None:
    """Build the arm's engine once and run every task of the spec into records/<role>/."""
    from evals.arm import ArmConfig, ArmTask, run_arm
    from qa.arm_inputs import resolved_engine_args, task_options
    from qa.arm_server import arm_server

    arm = spec.arms[role]  # type: ignore[index]
    tasks = [ArmTask(t.name, task_options(t, spec.chat), t.limit, t.repeats) for t in spec.tasks]
    with arm_server(spec, role, rd) as base_url:  # type: ignore[arg-type]
        args = resolved_engine_args(spec, role, rd, base_url=base_url)  # type: ignore[arg-type]
        config = ArmConfig(name=role, engine=arm.engine, model=spec.arm_model(role),  # type: ignore[arg-type]
                           engine_args=args, server=arm.server.model_dump() if arm.server is not None else None,
                           seed=spec.seed, data_dir=data_dir)
        run_arm(config, tasks, rd.root)


def calibrate_candidate(spec: RunSpec, rd: RunDir, data_dir: Path | None) -> None:
    """Calibrate the candidate model's KV scales as the spec's [calibration] asks, into calibration/."""
    from evals.engines.hf.args import HFEngineArgs
    from qa.calibration import calibrate_model
    from quant.calibrate import CalibrationSpec

    cal = spec.calibration
    if cal is None:
        raise SpecError("the spec has no [calibration] table")
    qspec = CalibrationSpec(format=cal.format, observer=cal.observer, percentile=cal.percentile,
                            granularity=cal.granularity, n_samples=cal.n_samples, seq_len=cal.seq_len, seed=spec.seed)
    args = spec.arms["candidate"].engine_args
    device, dtype = (args.device, args.dtype) if isinstance(args, HFEngineArgs) else ("cpu", "float32")
    scales = calibrate_model(spec.arm_model("candidate"), cal.dataset, qspec, data_dir, device, dtype,
                             trust_remote_code=spec.trust_remote_code)
    scales.save(rd.scales)


def inspect_candidate(spec: RunSpec, rd: RunDir, data_dir: Path | None) -> None:
    """Per-layer distortion of the candidate's emulated KV cache on WikiText-2 prompts -> kv_inspect.json."""
    from evals.engines.hf import read_scales
    from evals.engines.hf.args import HFEngineArgs
    from evals.models import load_model, resolve_model
    from qa.arm_inputs import emulated_kv, resolved_engine_args
    from qa.calibration import load_prompts
    from quant.inspect import inspect_kv, save_inspect

    kv_spec = emulated_kv(spec, "candidate")
    args = resolved_engine_args(spec, "candidate", rd)
    if kv_spec is None or not isinstance(args, HFEngineArgs):
        raise SpecError("the candidate does not run the emulated KV cache: nothing to inspect")
    scales = read_scales(args) if kv_spec.scales == "static" else None
    model, tokenizer = load_model(resolve_model(spec.arm_model("candidate")), dtype=args.dtype, device=args.device,
                                  trust_remote_code=spec.trust_remote_code)
    _, prompts = load_prompts(tokenizer, "wikitext2", data_dir, INSPECT_PROMPTS, INSPECT_TOKENS, spec.seed)
    save_inspect(rd.kv_inspect, inspect_kv(model, prompts, kv_spec, scales, model_name=spec.arm_model("candidate")))


def main(argv: list[str] | None = None) -> int:
    """Parse RUN_DIR ROLE [--data-dir], do that one step; 2 on a user error."""
    parser = argparse.ArgumentParser(prog="qa.worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    quiet_third_party_logs()
    rd = RunDir(args.run_dir)
    try:
        spec = rd.load_spec()
        if args.role == "calibrate":
            calibrate_candidate(spec, rd, args.data_dir)
        elif args.role == "kv-inspect":
            inspect_candidate(spec, rd, args.data_dir)
        elif args.role not in spec.arms:
            raise SpecError(f"the spec has no arm {args.role!r}")
        else:
            run_spec_arm(spec, rd, args.role, args.data_dir)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
