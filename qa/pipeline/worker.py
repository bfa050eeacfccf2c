"""Child process of `qa run`: one arm, the calibration step, or the KV-cache inspection of a run.

    python -m qa.pipeline.worker RUN_DIR {ARM_NAME|calibrate|kv-inspect} [--serve]

Reads only RUN_DIR/resolved.json (what the parent resolved, qa.files.resolved_json) and, for its step, the
calibration/ folder; writes only its own part: records/<arm>/, calibration/ (the scales and, when a vLLM
candidate is fed by them, the model folder carrying them), or the kv_inspect.json of each emulated-cache
candidate that has none. `--serve` keeps an arm's engine and runs the blocks of a sequential run sent on
stdin (qa.pipeline.sequential). User errors: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evals.engines import parse_engine_args
from evals.engines.hf import read_scales
from evals.engines.hf.args import HFEngineArgs
from evals.models.load import load_model
from evals.models.resolve import resolve_model
from evals.run.arm import open_arm, run_arm
from evals.run.progress import ARMS_ENV
from qa.errors import USER_ERRORS, SpecError
from qa.files.resolved_json import ArmRecord, ResolvedRecord
from qa.files.rundir import RunDir
from qa.logs import quiet_third_party_logs
from qa.pipeline.resolved_run import arm_config, arm_tasks
from qa.pipeline.servers import arm_server
from quant.fileio import scales_paths

STEPS = ("calibrate", "kv-inspect")  # every other role is an arm name of the run
INSPECT_PROMPTS, INSPECT_TOKENS = 4, 256  # WikiText-2 prompts x tokens the KV inspection reads


def run_one_arm(record: ResolvedRecord, arm: ArmRecord, rd: RunDir) -> None:
    """Build the arm's engine once and run every task into records/<arm>/."""
    with arm_server(arm, rd) as base_url:
        run_arm(arm_config(record, arm, base_url=base_url), arm_tasks(record), rd.root)


def serve_arm(record: ResolvedRecord, arm: ArmRecord, rd: RunDir) -> None:
    """`--serve`: build the arm's engine (and its server) once, then run one block per command on stdin
    (the protocol of qa.pipeline.sequential)."""
    sys.stdout.flush()
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything else printed (a server's address, a library's chatter) goes to stderr

    def answer(obj: Mapping[str, Any]) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    with arm_server(arm, rd) as base_url, \
            open_arm(arm_config(record, arm, base_url=base_url), arm_tasks(record), rd.root) as opened:
        answer({"ready": True, "pid": os.getpid()})
        for line in sys.stdin:
            command = json.loads(line)
            if command.get("cmd") == "close":
                break
            try:
                done = opened.run(command["task"], blocks=command["blocks"])
            except USER_ERRORS as exc:
                answer({"error": str(exc)})
                continue
            answer({"task": done.task, "written": done.written, "skipped": done.skipped, "errors": done.errors,
                    "seconds": round(done.seconds, 3), "pid": os.getpid()})


def calibrate_step(record: ResolvedRecord, rd: RunDir) -> None:
    """Calibrate the candidate model's KV scales as [calibration] asks, into calibration/ (and the vLLM
    model folder that carries them, when a vLLM candidate is fed by them)."""
    from qa.pipeline.calibration import (  # torch: calibration runs the model
        calibrate_model,
        export_vllm_model,
    )
    from quant.kv.calibrate import CalibrationSpec  # torch: the observers are torch code
    from quant.scales.files import KVScales  # torch: scales are tensors

    cal = record.calibration
    if cal is None:
        raise SpecError("the run has no [calibration] step")
    out = rd.root / cal.scales
    calibrated = all(p.exists() for p in scales_paths(out))  # a kill between the two writes leaves only one
    folder = rd.root / cal.vllm_model if cal.vllm_model is not None else None
    export = folder is not None and not (folder / "config.json").is_file()
    if calibrated and not export:
        return
    model = resolve_model(cal.model)  # once in this process (resolved.json names it by name)
    if calibrated:
        scales = KVScales.load(out)
    else:
        step = cal.step
        qspec = CalibrationSpec(format=step.format, observer=step.observer, percentile=step.percentile,
                                granularity=step.granularity, n_samples=step.n_samples, seq_len=step.seq_len,
                                seed=record.seed)
        scales = calibrate_model(model, step.dataset, qspec, Path(record.data_dir) if record.data_dir else None,
                                 cal.device, cal.dtype, trust_remote_code=record.trust_remote_code)
        scales.save(out)
    if export:
        assert folder is not None  # export implies a folder
        export_vllm_model(model, scales, folder)


def emulated(arm: ArmRecord) -> HFEngineArgs | None:
    """An arm's hf engine arguments when it runs the emulated quantized KV cache, else None."""
    if arm.engine != "hf" or arm.engine_args is None:
        return None
    args = parse_engine_args("hf", arm.engine_args)
    assert isinstance(args, HFEngineArgs)  # parsed for the hf engine
    return args if args.kv is not None and args.kv.format != "none" else None


def inspect_step(record: ResolvedRecord, rd: RunDir) -> None:
    """kv_inspect.json (per-layer distortion on WikiText-2 prompts) of every emulated-cache candidate without one."""
    from qa.pipeline.calibration import load_prompts  # torch: token chunks are tensors
    from quant.kv.inspect import inspect_kv, save_inspect  # torch: the inspection runs the model

    todo = [(a, args) for a in record.candidates if (args := emulated(a)) is not None]
    if not todo:
        raise SpecError("no candidate runs the emulated KV cache: nothing to inspect")
    data_dir = Path(record.data_dir) if record.data_dir else None
    for arm, args in todo:
        out = rd.root / (arm.out or ".") / "kv_inspect.json"
        if out.exists():
            continue
        assert args.kv is not None  # emulated() checked it
        scales = read_scales(args) if args.kv.scales == "static" else None
        model, tokenizer = load_model(resolve_model(arm.load), dtype=args.dtype, device=args.device,
                                      trust_remote_code=record.trust_remote_code)
        _, prompts = load_prompts(tokenizer, "wikitext2", data_dir, INSPECT_PROMPTS, INSPECT_TOKENS, record.seed)
        save_inspect(out, inspect_kv(model, prompts, args.kv, scales, model_name=arm.model))


def main(argv: list[str] | None = None) -> int:
    """Parse RUN_DIR ROLE [--serve], do that one step; 2 on a user error."""
    parser = argparse.ArgumentParser(prog="qa.pipeline.worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("role", help="an arm name of the run, or " + " / ".join(STEPS))
    parser.add_argument("--serve", action="store_true", help="keep the arm's engine: run blocks sent on stdin")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    quiet_third_party_logs()
    rd = RunDir(args.run_dir)
    try:
        record = rd.load_resolved()
        os.environ.setdefault(ARMS_ENV, str(max(1, sum(a.runs for a in record.arms))))  # for the estimate lines
        if args.serve and args.role in STEPS:
            raise SpecError(f"--serve keeps an arm's engine; {args.role!r} is not an arm")
        if args.role == "calibrate":
            calibrate_step(record, rd)
        elif args.role == "kv-inspect":
            inspect_step(record, rd)
        elif args.serve:
            serve_arm(record, record.arm(args.role), rd)
        else:
            run_one_arm(record, record.arm(args.role), rd)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
