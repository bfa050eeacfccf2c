"""The calibration step of `qa run`: static KV scales for the candidate, written to <run>/calibration/."""

from __future__ import annotations

from pathlib import Path

from qa.spec import RunSpec


def calibrate_for_run(spec: RunSpec, run_dir: Path, data_dir: Path | None) -> Path:
    """Calibrate the candidate model's KV scales as the spec's [calibration] asks; returns the file."""
    from qa.commands.calibrate import calibrate_model
    from qa.pipeline import scales_path
    from quant.calibrate import CalibrationSpec

    cal = spec.calibration
    if cal is None:
        raise ValueError("calibrate_for_run needs a [calibration] table")  # internal: callers check first
    qspec = CalibrationSpec(format=cal.format, observer=cal.observer, percentile=cal.percentile,
                            granularity=cal.granularity, n_samples=cal.n_samples, seq_len=cal.seq_len,
                            seed=spec.seed)
    device = str(spec.arms["candidate"].engine_args.get("device", "cpu"))
    dtype = str(spec.arms["candidate"].engine_args.get("dtype", "float32"))
    scales = calibrate_model(spec.arm_model("candidate"), cal.dataset, qspec, data_dir, device, dtype,
                             trust_remote_code=spec.trust_remote_code)
    out = scales_path(run_dir)
    scales.save(out)
    return out
