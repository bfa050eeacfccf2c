"""Child process of `qa run`: one arm, the calibration step, or the KV-cache inspection of a run.

    python -m qa.run.worker RUN_DIR {ARM_NAME|calibrate|kv-inspect} [--data-dir DIR] [--serve]

Reads only RUN_DIR/spec.toml (and calibration/ when it exists); writes only its own part:
records/<arm>/, calibration/, or the kv_inspect.json of each emulated-cache candidate that has none
(RunDir.kv_inspect, in candidates/<name>/ when the run has several). `--serve` keeps an arm's engine and
runs the blocks of a sequential run sent on stdin (qa.run.sequential). User errors: one line, exit 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from qa.errors import USER_ERRORS, SpecError
from qa.logs import quiet_third_party_logs
from qa.files.rundir import RunDir
from qa.files.spec import RunSpec

STEPS = ("calibrate", "kv-inspect")  # every other role is an arm name of the spec
INSPECT_PROMPTS, INSPECT_TOKENS = 4, 256  # WikiText-2 prompts x tokens the KV inspection reads


def run_spec_arm(spec: RunSpec, rd: RunDir, role: str, data_dir: Path | None) -> None:
    """Build the arm's engine once and run every task of the spec into records/<role>/."""
    from evals.arm import run_arm
    from qa.run.arm_inputs import arm_config, arm_tasks
    from qa.run.servers import arm_server

    with arm_server(spec, role, rd) as base_url:
        run_arm(arm_config(spec, role, rd, data_dir, base_url=base_url), arm_tasks(spec), rd.root)


def calibrated_arm(spec: RunSpec) -> str:
    """The candidate whose model, device and dtype [calibration] runs with: the first with static scales."""
    from qa.run.arm_inputs import static_scales_candidates

    return (static_scales_candidates(spec) or spec.candidates)[0]


def calibrate_candidate(spec: RunSpec, rd: RunDir, data_dir: Path | None) -> None:
    """Calibrate the candidate model's KV scales as the spec's [calibration] asks, into calibration/."""
    from evals.engines.hf.args import HFEngineArgs
    from qa.run.calibration import calibrate_model
    from quant.calibrate import CalibrationSpec

    cal = spec.calibration
    if cal is None:
        raise SpecError("the spec has no [calibration] table")
    qspec = CalibrationSpec(format=cal.format, observer=cal.observer, percentile=cal.percentile,
                            granularity=cal.granularity, n_samples=cal.n_samples, seq_len=cal.seq_len, seed=spec.seed)
    name = calibrated_arm(spec)
    args = spec.arms[name].engine_args
    device, dtype = (args.device, args.dtype) if isinstance(args, HFEngineArgs) else ("cpu", "float32")
    scales = calibrate_model(spec.arm_model(name), cal.dataset, qspec, data_dir, device, dtype,
                             trust_remote_code=spec.trust_remote_code)
    scales.save(rd.scales)


def inspected_dirs(spec: RunSpec, rd: RunDir) -> dict[str, RunDir]:
    """Each emulated-cache candidate and the folder its kv_inspect.json goes in."""
    from qa.run.arm_inputs import emulated_kv

    return {n: rd.candidate(n) if spec.per_candidate_dirs else rd for n in spec.candidates
            if emulated_kv(spec, n) is not None}


def inspect_candidates(spec: RunSpec, rd: RunDir, data_dir: Path | None) -> None:
    """kv_inspect.json of every emulated-cache candidate that has none yet."""
    dirs = inspected_dirs(spec, rd)
    if not dirs:
        raise SpecError("no candidate runs the emulated KV cache: nothing to inspect")
    for name, out in dirs.items():
        if not out.kv_inspect.exists():
            inspect_candidate(spec, rd, data_dir, name, out)


def inspect_candidate(spec: RunSpec, rd: RunDir, data_dir: Path | None, name: str, out: RunDir) -> None:
    """Per-layer distortion of one candidate's emulated KV cache on WikiText-2 prompts -> kv_inspect.json."""
    from evals.engines.hf import read_scales
    from evals.engines.hf.args import HFEngineArgs
    from evals.models import load_model, resolve_model
    from qa.run.arm_inputs import emulated_kv, resolved_engine_args
    from qa.run.calibration import load_prompts
    from quant.inspect import inspect_kv, save_inspect

    kv_spec = emulated_kv(spec, name)
    args = resolved_engine_args(spec, name, rd)
    if kv_spec is None or not isinstance(args, HFEngineArgs):
        raise SpecError(f"candidate {name!r} does not run the emulated KV cache: nothing to inspect")
    scales = read_scales(args) if kv_spec.scales == "static" else None
    model, tokenizer = load_model(resolve_model(spec.arm_model(name)), dtype=args.dtype, device=args.device,
                                  trust_remote_code=spec.trust_remote_code)
    _, prompts = load_prompts(tokenizer, "wikitext2", data_dir, INSPECT_PROMPTS, INSPECT_TOKENS, spec.seed)
    save_inspect(out.kv_inspect, inspect_kv(model, prompts, kv_spec, scales, model_name=spec.arm_model(name)))


def main(argv: list[str] | None = None) -> int:
    """Parse RUN_DIR ROLE [--data-dir], do that one step; 2 on a user error."""
    parser = argparse.ArgumentParser(prog="qa.run.worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("role", help="an arm name of the spec, or " + " / ".join(STEPS))
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--serve", action="store_true", help="keep the arm's engine: run blocks sent on stdin")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    quiet_third_party_logs()
    rd = RunDir(args.run_dir)
    try:
        spec = rd.load_spec()
        if args.serve and args.role in STEPS:
            raise SpecError(f"--serve keeps an arm's engine; {args.role!r} is not an arm")
        if args.role == "calibrate":
            calibrate_candidate(spec, rd, args.data_dir)
        elif args.role == "kv-inspect":
            inspect_candidates(spec, rd, args.data_dir)
        elif args.role not in spec.arms:
            raise SpecError(f"the spec has no arm {args.role!r}")
        elif args.serve:
            from qa.run.sequential import serve_arm

            serve_arm(spec, rd, args.role, args.data_dir)
        else:
            run_spec_arm(spec, rd, args.role, args.data_dir)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
