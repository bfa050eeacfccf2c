"""Fault injection and real engines (issue 7, items 4 and 5): run the specs through `qa run` and
commit their comparison, verdict and reports (not the records) under reports/.

    python scripts/fault_study.py faults  [--names v_scale_layout,aa] [--work DIR] [--seed-from RUN_DIR]
    python scripts/fault_study.py engines [--names vllm_bf16_vs_fp8,...] [--seed-from RUN_DIR]
    python scripts/fault_study.py table   # rebuild TABLE.md / SUMMARY.md from reports/{faults,engines}/

faults: every spec in examples/faults/ shares the model, seed, baseline arm and tasks (checked), and
each fault spec's candidate is the reference NVFP4 KV cache plus one preset of quant/faults.py
(checked against `quant.faults.fault_spec`); two controls: `aa` (the baseline again at another batch
size: the gate must not fail it) and `reference` (the correct NVFP4 candidate). The baseline arm and
the calibration run once, in the first run directory (or come from --seed-from, a run directory of
the same baseline arm); every later run directory is seeded with a copy of records/baseline/ (the
spec's task files, arm.json listing them) and calibration/ before `qa run`, which then resumes: its
baseline arm finds every sample on disk and writes nothing (checked: the seeded files' sha256 do not
change). The hf engine on CPU is deterministic, so the copy is what a fresh baseline arm would write.

engines: vLLM-CPU bf16 KV vs fp8 KV; vLLM-CPU with kv_cache_dtype "nvfp4" (first without the
override, to record the engine's refusal, then with allow_unsupported_kv_cache_dtype, reusing the
bf16 baseline records); llama.cpp's server (xllamacpp) with an f16 vs an NVFP4 KV cache on
generative GSM8K, whose servers this script starts on the spec's 127.0.0.1 ports and stops by pid
(`qa run` does not start servers); the emulator's NVFP4 on the same GSM8K items, and the hf baseline
again at another batch size there (the noise floor of completion agreement).

Arms run under `nice -n 5` (the machine is shared). Each run directory goes to
<work>/<group>/<name>/ (default reports/runs/study/, ignored by git); reports/<group>/<name>/ receives
spec.toml, env.json, comparison.json, verdict.json, report.md, report.html, plots/ and run.json
(exit code, wall time, what was reused and whether the reused arm resumed unchanged).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qa.rundir import prepare_run_dir
from qa.spec import RunSpec, load_spec
from quant.fileio import sha256_file

FAULT_DIR = ROOT / "examples" / "faults"
ENGINE_DIR = ROOT / "examples" / "engines"
REPORTS = ROOT / "reports"
COPIED_FILES = ("spec.toml", "env.json", "comparison.json", "verdict.json", "report.md", "report.html")
# Run order: the first spec computes the shared baseline arm and calibration.
FAULTS = (
    "v_scale_layout",
    "uncalibrated_scale_1",
    "scale_10x",
    "nvfp4_no_window",
    "corrupt_1pct",
    "aa",
    "reference",
)
AA = "aa"  # control: the baseline again at another batch size
REFERENCE = "reference"  # control: the correct NVFP4 candidate every fault preset is applied to
# The A/A control again at 300 chunks, with its own baseline (0 differences pass the 1-pt margin from n = 299).
AA_LARGE = "aa_n300"
# The kv table of the correct candidate (examples/smollm2_nvfp4_kv.toml's): the fault presets' base.
REFERENCE_KV: dict[str, Any] = {
    "format": "nvfp4",
    "scales": "static",
    "recent_window": 128,
    "recent_format": "fp8_e4m3",
}
ENGINES = (
    "vllm_bf16_vs_fp8",
    "vllm_nvfp4_override",
    "llamacpp_f16_vs_nvfp4",
    "emulator_nvfp4_gsm8k",
    "emulator_aa_gsm8k",
)
NICE = 5


@dataclass(frozen=True)
class RunOutcome:
    """What one `qa run` did."""

    name: str
    exit_code: int
    seconds: float
    stderr_tail: str


# -- running ----------------------------------------------------------------------------------------


def qa_command() -> list[str]:
    """The `qa` console command of this interpreter's environment."""
    qa = Path(sys.executable).parent / "qa"
    return [str(qa)] if qa.exists() else [sys.executable, "-m", "qa.cli"]


def run_qa(name: str, spec_path: Path, run_dir: Path, data_dir: Path | None, log_path: Path) -> RunOutcome:
    """`nice -n 5 qa run SPEC --out RUN_DIR`, output to `log_path`; exit 0/1/3 are verdicts, 2 an error."""
    cmd = ["nice", "-n", str(NICE), *qa_command(), "run", str(spec_path), "--out", str(run_dir)]
    if data_dir is not None:
        cmd += ["--data-dir", str(data_dir)]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.PIPE, check=False)
        log.write(proc.stderr)
    seconds = time.monotonic() - start
    err = proc.stderr.decode(errors="replace").strip().splitlines()
    tail = "\n".join(line for line in err if line.startswith("error:"))[-2000:]
    print(
        f"  {name}: exit {proc.returncode} in {seconds:.0f} s{(' (' + tail + ')') if tail else ''}",
        flush=True,
    )
    return RunOutcome(name, proc.returncode, seconds, tail)


def seed_arm(
    spec: RunSpec, run_dir: Path, source: Path, role: str = "baseline", calibration: bool = True
) -> dict[str, str]:
    """Create `run_dir` for `spec` and copy `source`'s records/<role>/ task files that `spec` runs, with
    its arm.json listing just those tasks, and (if asked) calibration/; returns sha256 per copied file.
    The arm process still checks that the copied arm and task fingerprints match the spec's."""
    prepare_run_dir(spec, run_dir)
    src, dst = source / "records" / role, run_dir / "records" / role
    if not (src / "arm.json").exists():
        raise SystemExit(f"error: {src} has no arm.json: run the source spec first")
    wanted = {t.name for t in spec.tasks}
    dst.mkdir(parents=True, exist_ok=True)
    copied: dict[str, str] = {}
    for path in sorted(src.glob("*.jsonl")):
        if path.stem in wanted and path.stat().st_size > 0:
            if not (dst / path.name).exists():
                shutil.copy2(path, dst / path.name)
            copied[path.name] = sha256_file(dst / path.name)
    if not (dst / "arm.json").exists():
        manifest = json.loads((src / "arm.json").read_text(encoding="utf-8"))
        manifest["tasks"] = {k: v for k, v in manifest["tasks"].items() if f"{k}.jsonl" in copied}
        (dst / "arm.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if calibration and (source / "calibration").is_dir() and not (run_dir / "calibration").exists():
        shutil.copytree(source / "calibration", run_dir / "calibration")
    return copied


def check_unchanged(run_dir: Path, role: str, seeded: dict[str, str]) -> bool:
    """True when every seeded record file is byte-identical after the run (the arm resumed, wrote nothing)."""
    arm = run_dir / "records" / role
    return all(sha256_file(arm / name) == digest for name, digest in seeded.items())


def publish(run_dir: Path, dest: Path, info: dict[str, Any]) -> None:
    """Copy the run's reports (not its records) to `dest`, plus run.json with `info`."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED_FILES:
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, dest / name)
    if (run_dir / "plots").is_dir():
        shutil.rmtree(dest / "plots", ignore_errors=True)
        shutil.copytree(run_dir / "plots", dest / "plots")
    (dest / "run.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# -- the fault study --------------------------------------------------------------------------------


def load_fault_specs(names: Sequence[str]) -> dict[str, RunSpec]:
    """The fault specs, checked to share model, seed, baseline arm, tasks and (where set) calibration,
    and each fault's candidate kv to equal its preset applied to the reference KV cache."""
    from quant.faults import fault_spec
    from quant.kv_spec import kv_spec_from_dict

    specs = {n: load_spec(FAULT_DIR / f"{n}.toml") for n in FAULTS}
    first = specs[FAULTS[0]]
    for name, spec in specs.items():
        same = (spec.model, spec.seed, spec.arms["baseline"], spec.tasks, spec.policy)
        if same != (first.model, first.seed, first.arms["baseline"], first.tasks, first.policy):
            raise SystemExit(
                f"error: examples/faults/{name}.toml differs from {FAULTS[0]}.toml in "
                "model, seed, baseline arm, tasks or policy: they must share them"
            )
        if spec.calibration is not None and spec.calibration != first.calibration:
            raise SystemExit(
                f"error: examples/faults/{name}.toml calibrates differently from {FAULTS[0]}.toml"
            )
        kv = spec.arms["candidate"].engine_args.get("kv")
        if name == AA:
            if kv is not None:
                raise SystemExit(
                    "error: the A/A spec's candidate must have no kv table (it is the baseline again)"
                )
            continue
        base = kv_spec_from_dict(REFERENCE_KV)
        want = base if name == REFERENCE else fault_spec(name, base)
        if kv is None or kv_spec_from_dict(kv) != want:
            raise SystemExit(
                f"error: examples/faults/{name}.toml candidate kv is not preset {name!r} applied "
                f"to the reference {REFERENCE_KV}; expected {want.model_dump(exclude_defaults=True)}"
            )
    return {n: specs[n] for n in names}


def seed_calibration(spec: RunSpec, run_dir: Path, source: Path) -> str:
    """Copy calibration/ from another run directory whose spec has the same model, seed and
    [calibration] table (calibration is deterministic); returns the sha256 of the scales file."""
    from qa.rundir import load_run_spec

    other = load_run_spec(source)
    if (other.model, other.seed, other.calibration) != (spec.model, spec.seed, spec.calibration):
        raise SystemExit(f"error: {source} was calibrated with another model, seed or [calibration] table")
    prepare_run_dir(spec, run_dir)
    if not (run_dir / "calibration").exists():
        shutil.copytree(source / "calibration", run_dir / "calibration")
    return sha256_file(run_dir / "calibration" / "kv_scales.safetensors")


def run_faults(
    names: Sequence[str], work: Path, data_dir: Path | None, seed_from: Path | None = None
) -> None:
    """Run the fault specs (baseline once), publish each to reports/faults/<name>/, write TABLE.md.
    `seed_from`: a run directory whose baseline records (same arm, same task options) and calibration
    (same [calibration]) the first run reuses instead of computing them."""
    specs = load_fault_specs(FAULTS)
    source = work / "faults" / FAULTS[0]
    for name in names:
        run_dir = work / "faults" / name
        info: dict[str, Any] = {
            "spec": f"examples/faults/{name}.toml",
            "preset": None if name in (AA, REFERENCE, AA_LARGE) else name,
        }
        seeded: dict[str, str] = {}
        if name == AA_LARGE:  # its own baseline at its own n: nothing to seed
            if "kv" in load_spec(FAULT_DIR / f"{name}.toml").arms["candidate"].engine_args:
                raise SystemExit(f"error: examples/faults/{name}.toml: the A/A candidate must have no kv table")
        elif name == FAULTS[0] and seed_from is not None:
            spec = specs[name]
            info["calibration_seeded_from"] = {
                "run_dir": str(seed_from),
                "sha256": seed_calibration(spec, run_dir, seed_from),
            }
            seeded = seed_arm(spec, run_dir, seed_from, calibration=False)
            info["baseline_seeded_from"] = f"{seed_from} (records/baseline/: {', '.join(seeded)})"
        elif name != FAULTS[0]:
            spec = specs[name]
            seeded = seed_arm(spec, run_dir, source, calibration=spec.calibration is not None)
            info["baseline_seeded_from"] = f"{FAULTS[0]} run directory (records/baseline/, calibration/)"
        out = run_qa(name, FAULT_DIR / f"{name}.toml", run_dir, data_dir, work / "logs" / f"fault-{name}.log")
        if seeded:
            info["baseline_resumed_unchanged"] = check_unchanged(run_dir, "baseline", seeded)
            if not info["baseline_resumed_unchanged"]:
                print(f"  WARNING: {name}: the seeded baseline records changed: the arm re-ran", flush=True)
        info.update(
            exit_code=out.exit_code, wall_seconds=round(out.seconds, 1), error=out.stderr_tail or None
        )
        publish(run_dir, REPORTS / "faults" / name, info)  # a failed run publishes its error in run.json
    write_fault_table(REPORTS / "faults")


# -- TABLE.md ---------------------------------------------------------------------------------------


def _pts(x: float | None, signed: bool = True) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def _n_to_fail(est: dict[str, Any], margin: float, alpha: float) -> str:
    """Items at which the observed drop would fail non-inferiority (the CI's upper limit below -margin),
    if delta and sd of differences stayed as observed: ceil((z_{1-alpha} sd / (|delta| - margin))^2)."""
    from scipy import stats as sps

    delta, sd = est.get("delta"), est.get("sd_diff")
    if delta is None or sd is None:
        return "-"
    if -delta <= margin:
        return "never (drop <= margin)"
    return str(max(2, math.ceil((float(sps.norm.ppf(1 - alpha)) * sd / (-delta - margin)) ** 2)))


def _n_sigma_fails(est: dict[str, Any], k: float) -> str:
    """Items at which |delta| would exceed k x baseline SE if delta and the baseline sd stayed as
    observed: the SE shrinks as 1/sqrt(n), so n' = ceil(n (k SE_base / |delta|)^2)."""
    delta, se, n = est.get("delta"), est.get("se_baseline"), est.get("n")
    if not delta or not se or not n:
        return "-"
    return str(max(2, math.ceil(n * (k * se / abs(delta)) ** 2)))


def _dist(comparison: dict[str, Any], metric: str) -> dict[str, Any] | None:
    return next((d for d in comparison.get("distribution", []) if d["metric"] == metric), None)


def fault_rows(folder: Path, names: Sequence[str]) -> tuple[list[str], list[str]]:
    """Markdown rows of the summary table (one per fault) and the per-task table."""
    summary, detail = [], []

    def control_kld(name: str) -> dict[str, Any] | None:
        path = folder / name / "comparison.json"
        return _dist(json.loads(path.read_text()), "kld") if path.exists() else None

    def z_vs(kld: dict[str, Any] | None, ref: dict[str, Any] | None) -> str:
        if kld is None or ref is None or kld is ref or not math.hypot(kld["se"] or 0, ref["se"] or 0):
            return "-"
        return f"{(kld['value'] - ref['value']) / math.hypot(kld['se'] or 0, ref['se'] or 0):+.1f}"

    aa_kld, ref_kld = control_kld(AA), control_kld(REFERENCE)
    for name in names:
        if not (folder / name / "verdict.json").exists():
            summary.append(f"| {name} | | not run | | | | | | | | |")
            continue
        comp = json.loads((folder / name / "comparison.json").read_text())
        verdict = json.loads((folder / name / "verdict.json").read_text())
        run = (
            json.loads((folder / name / "run.json").read_text())
            if (folder / name / "run.json").exists()
            else {}
        )
        kld, top1 = _dist(comp, "kld"), _dist(comp, "top1_agree")
        kld_txt = (
            "-"
            if kld is None
            else f"{kld['value']:.4f} ± {kld['se']:.4f}"
            if kld["se"]
            else f"{kld['value']:.4f}"
        )
        z = z_vs(kld, aa_kld) if name not in (AA, AA_LARGE) else "-"
        z_ref = z_vs(kld, ref_kld) if name not in (AA, AA_LARGE, REFERENCE) else "-"
        top1_txt = "-" if top1 is None else f"{100 * top1['value']:.1f}%"
        failed = [t["task"] for t in verdict["tasks"] if t["status"] == "fail"]
        incon = [t["task"] for t in verdict["tasks"] if t["status"] == "inconclusive"]
        caught = ", ".join(failed) if failed else "-"
        status = verdict["status"]
        expected = {AA: "pass", AA_LARGE: "pass", REFERENCE: "(control)"}.get(name, "fail")
        ok = (
            "-"
            if name == REFERENCE
            else "yes"
            if status == expected
            else "no false alarm, not a pass"
            if name in (AA, AA_LARGE) and status == "inconclusive"
            else "**NO**"
        )
        summary.append(
            f"| {name} | {expected} | **{status.upper()}** | {ok} | {caught} | {', '.join(incon) or '-'} | {kld_txt} | "
            f"{z} | {z_ref} | {top1_txt} | {run.get('wall_seconds', '-')} |"
        )
        for t in verdict["tasks"]:
            est = next(
                e
                for e in comp["estimates"]
                if f"{e['task']}" == t["task"] and f"{e['metric']},{e['filter']}" == t["metric"]
            )
            rules = {r["rule"]: r for r in t["rules"]}
            ni, sig = rules.get("noninferiority"), rules.get("sigma")
            flips = est.get("flips")
            flip_txt = "-" if not flips else (f"{flips['n10']}↓ {flips['n01']}↑ ({100 * flips['rate']:.1f}%)")
            sig_txt = "-" if sig is None else ("pass" if sig["status"] == "pass" else "FAIL")
            detail.append(
                f"| {name} | {t['task']} | {t['metric']} | {t['n']} | {_pts(est['mean_baseline'], False)} → "
                f"{_pts(est['mean_candidate'], False)} | {_pts(t['delta'])} | {_pts(t['se_paired'], False)} | "
                f"{'-' if ni is None else ni['status']} | {sig_txt} | {flip_txt} | {t['status']} ({t['kind']}) | "
                f"{_pts(t['mde'], False)} | {_n_to_fail(est, t['margin'], t['alpha'])} | "
                f"{_n_sigma_fails(est, sig['k'] if sig else 1.5)} |"
            )
    return summary, detail


def write_fault_table(folder: Path) -> Path:
    """reports/faults/TABLE.md from the published comparison.json / verdict.json / run.json files."""
    summary, detail = fault_rows(folder, (*FAULTS, AA_LARGE))
    lines = [
        "# Fault injection: does the gate catch deliberately broken NVFP4 KV caches?",
        "",
        "Generated by `python scripts/fault_study.py faults` (rebuild: `... table`) from the run folders",
        "next to this file; specs in `examples/faults/`. Model SmolLM2-135M-Instruct (fp32, CPU), default",
        "gate policy (non-inferiority, margin 2 pts, 1 pt for WikiText top-1; alpha 0.05; min_n 50).",
        "Every candidate is the reference NVFP4 KV cache (calibrated static scales, last 128 positions in",
        "FP8 E4M3) plus one fault preset of `quant/faults.py`. Controls: `aa` is the baseline again at",
        "batch size 5 (must pass), `reference` the correct NVFP4 candidate itself (no fault); `aa_n300` is",
        "the A/A again at 300 chunks with its own baseline: a bit-identical A/A has 0 differing chunks, and",
        "the gate's exact bound on the drop, 1 - 0.05^(1/n) (about 3/n), is under the 1-point margin only",
        "from n = 299, so at the study's 50 chunks `aa` can only be INCONCLUSIVE.",
        "",
        'What each check caught, what it missed and why: README.md, section "Does the gate catch broken',
        'deployments?".',
        "",
        "## Per fault",
        "",
        "KLD: mean KL(baseline || candidate) per token on the WikiText-2 chunks (nats, SE clustered by",
        "article); z vs A/A / reference: (KLD - KLD of that control run) / combined SE (unpaired, so",
        "conservative: both are measured on the same chunks against the same baseline). Top-1 agree: share of WikiText",
        "positions whose top-1 next token is unchanged. Time: wall seconds of `qa run` (baseline reused).",
        "",
        (
            "| run | gate must | gate | as required | failed tasks | inconclusive tasks | KLD (nats) | z vs A/A | "
            "z vs reference | top-1 agree | time (s) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *summary,
        "",
        "## Per fault and task",
        "",
        "delta = candidate - baseline in points (negative = worse); SE = paired SE; NI = the",
        "non-inferiority rule (90% CI vs -margin); 1.5-SE = |delta| <= 1.5 x baseline SE (reported,",
        "not gating); flips = items whose score went down↓ / up↑ (share of items; for the per-chunk",
        "top-1 accuracy any change counts); MDE at 80% power; n to fail NI / 1.5-SE = items at which",
        "the observed drop would fail that rule if delta and the sd of differences (baseline sd for",
        "1.5-SE) stayed as observed: an extrapolation, not a measurement.",
        "",
        (
            "| run | task | metric | n | baseline → candidate | delta | SE | NI | 1.5-SE | flips | task status | MDE | "
            "n to fail NI | n to fail 1.5-SE |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *detail,
        "",
    ]
    path = folder / "TABLE.md"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)}", flush=True)
    return path


# -- real engines -----------------------------------------------------------------------------------


def _kv_line(log: Path) -> str | None:
    lines = [
        ln.strip() for ln in log.read_text(errors="replace").splitlines() if "llama_kv_cache: size" in ln
    ]
    return lines[0] if lines else None


def run_engines(
    names: Sequence[str], work: Path, data_dir: Path | None, seed_from: Path | None = None
) -> None:
    """The real-engine reference runs; each published to reports/engines/<name>/."""
    base_dir = work / "engines"
    for name in names:
        spec_path = ENGINE_DIR / f"{name}.toml"
        spec = load_spec(spec_path)
        run_dir = base_dir / name
        log = work / "logs" / f"engine-{name}.log"
        info: dict[str, Any] = {"spec": f"examples/engines/{name}.toml"}
        seeded: dict[str, str] = {}
        if name == "vllm_nvfp4_override":
            info["refusal"] = record_refusal(spec, work, data_dir)
            seeded = seed_arm(spec, run_dir, base_dir / "vllm_bf16_vs_fp8", calibration=False)
            info["baseline_seeded_from"] = "vllm_bf16_vs_fp8 run directory (records/baseline/)"
        elif name in ("emulator_nvfp4_gsm8k", "emulator_aa_gsm8k") and seed_from is not None:
            seeded = seed_arm(spec, run_dir, seed_from, calibration=False)
            info["baseline_seeded_from"] = f"{seed_from} (records/baseline/: {', '.join(seeded)})"
        out = run_qa(name, spec_path, run_dir, data_dir, log)  # `qa run` starts and stops any servers
        for role, arm in spec.arms.items():
            server_log = run_dir / "logs" / f"{role}-server.log"
            if arm.server is not None and server_log.is_file():
                info.setdefault("servers", {})[role] = arm.server.model_dump(exclude_defaults=True)
                info.setdefault("kv_cache_log_lines", {})[role] = _kv_line(server_log)
        if seeded:
            info["baseline_resumed_unchanged"] = check_unchanged(run_dir, "baseline", seeded)
        info.update(
            exit_code=out.exit_code, wall_seconds=round(out.seconds, 1), error=out.stderr_tail or None
        )
        publish(run_dir, REPORTS / "engines" / name, info)  # a failed run publishes its error in run.json
    write_engine_summary(REPORTS / "engines")


def record_refusal(spec: RunSpec, work: Path, data_dir: Path | None) -> dict[str, Any]:
    """Run the nvfp4 candidate once without allow_unsupported_kv_cache_dtype: the engine must refuse it.
    Returns the exit code and the error line (the run directory is a scratch one)."""
    args = {
        k: v for k, v in spec.arms["candidate"].engine_args.items() if k != "allow_unsupported_kv_cache_dtype"
    }
    strict = spec.model_copy(
        update={
            "name": spec.name + "-refused",
            "arms": {
                **spec.arms,
                "candidate": spec.arms["candidate"].model_copy(update={"engine_args": args}),
            },
        }
    )
    from qa.spec import dump_spec

    scratch = work / "engines" / "vllm_nvfp4_refused"
    shutil.rmtree(scratch, ignore_errors=True)
    spec_file = work / "engines" / "vllm_nvfp4_refused.toml"
    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(dump_spec(strict), encoding="utf-8")
    # Only the candidate matters here: run its arm process alone (the baseline is not needed to refuse).
    prepare_run_dir(strict, scratch)
    from qa.pipeline import arm_python

    cmd = ["nice", "-n", str(NICE), arm_python("vllm"), "-m", "qa.arm_worker", str(scratch), "candidate"]
    if data_dir is not None:
        cmd += ["--data-dir", str(data_dir)]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    print(
        f"  refusal check: exit {proc.returncode}: {errors[-1] if errors else '(no error line)'}", flush=True
    )
    return {
        "exit_code": proc.returncode,
        "error": errors[-1] if errors else None,
        "seconds": round(time.monotonic() - start, 1),
        "engine_args": args,
    }


def _share(agreement: dict[str, Any] | None, key: str) -> str:
    part = (agreement or {}).get(key)
    return "-" if not part else f"{part['agree']}/{part['n']} ({100 * part['share']:.0f}%)"


def _gsm8k_row(label: str, path: Path) -> str | None:
    """One side-by-side row for the GSM8K strict-match estimate of a published run, or None."""
    if not (path / "comparison.json").exists():
        return None
    comp = json.loads((path / "comparison.json").read_text())
    est = next(
        (
            e
            for e in comp["estimates"]
            if e["task"] == "gsm8k" and e["metric"] == "exact_match" and e["filter"] == "strict-match"
        ),
        None,
    )
    if est is None:
        return None
    fl = est.get("flips") or {}
    return (
        f"| {label} | {est['n']} | {_pts(est['mean_baseline'], False)} → {_pts(est['mean_candidate'], False)} | "
        f"{_pts(est['delta'])} ± {_pts(est['se_paired'], False)} | {fl.get('n10', '-')}↓ {fl.get('n01', '-')}↑ | "
        f"{_share(est.get('agreement'), 'extracted')} | {_share(est.get('agreement'), 'completion')} |"
    )


def write_engine_summary(folder: Path) -> Path:
    """reports/engines/SUMMARY.md: verdict per engine run, and the two NVFP4 implementations side by side."""
    lines = [
        "# Real engines: reference runs",
        "",
        "Generated by `python scripts/fault_study.py engines` from the run folders next to this file",
        "(specs in `examples/engines/`). Default gate policy.",
        "",
        "| run | gate | summary | WikiText KLD (nats) | time (s) |",
        "|---|---|---|---|---|",
    ]
    for name in ENGINES:
        d = folder / name
        if not (d / "verdict.json").exists():
            lines.append(f"| {name} | not run | | | |")
            continue
        verdict = json.loads((d / "verdict.json").read_text())
        comp = json.loads((d / "comparison.json").read_text())
        run = json.loads((d / "run.json").read_text()) if (d / "run.json").exists() else {}
        kld = _dist(comp, "kld")
        kld_txt = "-" if kld is None else f"{kld['value']:.4f} ± {kld['se'] or 0:.4f}"
        lines.append(
            f"| {name} | **{verdict['status'].upper()}** | {verdict['summary']} | {kld_txt} | "
            f"{run.get('wall_seconds', '-')} |"
        )
    refusal = folder / "vllm_nvfp4_override" / "run.json"
    if refusal.exists():
        r = json.loads(refusal.read_text()).get("refusal") or {}
        lines += [
            "",
            "## vLLM-CPU with kv_cache_dtype nvfp4, without the override",
            "",
            (
                f"The candidate arm alone, as a user would first run it: exit code {r.get('exit_code')}, "
                f"in {r.get('seconds')} s:"
            ),
            "",
            "```",
            str(r.get("error")),
            "```",
        ]
    lines += [
        "",
        "## Two NVFP4 KV caches on the same GSM8K items",
        "",
        "GSM8K strict-match, 5-shot, greedy, max 192 tokens; the same seeded items in every row.",
        "answers kept / completions kept: items whose extracted answer / whole completion is the",
        "same in both arms (the size of the effect when accuracy sits near the floor).",
        "",
        (
            "| implementation | n | baseline → candidate (%) | delta ± SE (pts) | flips | answers kept | "
            "completions kept |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    rows = [
        ("llama.cpp NVFP4 K+V vs f16 (real)", folder / "llamacpp_f16_vs_nvfp4"),
        ("emulator NVFP4, dynamic scales, no window", folder / "emulator_nvfp4_gsm8k"),
        ("vLLM-CPU FP8 KV vs bf16 (real)", folder / "vllm_bf16_vs_fp8"),
        ("noise floor: hf baseline again at batch size 5 (A/A)", folder / "emulator_aa_gsm8k"),
    ]
    lines += [row for label, path in rows if (row := _gsm8k_row(label, path)) is not None]
    path = folder / "SUMMARY.md"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)}", flush=True)
    return path


# -- main -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/fault_study.py", description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["faults", "engines", "table"])
    parser.add_argument("--names", default=None, help="comma-separated subset (default: all, in order)")
    parser.add_argument(
        "--work",
        type=Path,
        default=ROOT / "reports" / "runs" / "study",
        help="where the run directories go (default reports/runs/study, ignored by git)",
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="data folder (default $QA_DATA_DIR)")
    parser.add_argument(
        "--seed-from",
        type=Path,
        default=None,
        help="reuse the baseline records (and, for faults, calibration/) of a run directory "
        "with the same baseline arm and task options (and [calibration] table)",
    )
    ns = parser.parse_args(argv)
    if ns.part == "table":
        write_fault_table(REPORTS / "faults")
        write_engine_summary(REPORTS / "engines")
        return 0
    known = (*FAULTS, AA_LARGE) if ns.part == "faults" else ENGINES
    names = [n for n in ns.names.split(",") if n] if ns.names else list(FAULTS if ns.part == "faults" else ENGINES)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"error: unknown {ns.part} name(s) {unknown}; choose from {', '.join(known)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    if ns.part == "faults":
        run_faults(names, ns.work.resolve(), ns.data_dir, ns.seed_from)
    else:
        run_engines(names, ns.work.resolve(), ns.data_dir, ns.seed_from)
    print(f"{ns.part}: done in {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
