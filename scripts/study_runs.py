"""Running the fault and engine studies: each spec through `qa run` (under `nice`), the shared baseline arm
and calibration seeded into later run directories, and each run published to reports/<group>/<name>/.

Seeding copies records/baseline/ (the spec's task files, its arm.json (`evals.records.arm_file.ArmManifest`) listing just those
tasks) and calibration/
into a fresh run directory; `qa run` then resumes: its baseline arm finds every sample on disk and writes
nothing (checked: the seeded files' sha256 do not change). The hf engine on CPU is deterministic, so the
copy is what a fresh baseline arm would write.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.records.arm_file import ARM_FILE, ArmManifest
from qa.files.rundir import RunDir, prepare_run_dir
from qa.files.spec import ArmSpec, RunSpec, dump_spec, load_spec
from qa.pipeline.processes import WORKER_MODULE, arm_python
from qa.pipeline.resolve import resolve_run
from quant.fileio import sha256_file
from quant.kv.faults import fault_spec
from quant.kv.spec import kv_spec_from_dict
from scripts.study_published import Refusal, RunInfo, SeededCalibration, publish

ROOT = Path(__file__).resolve().parent.parent
FAULT_DIR = ROOT / "examples" / "faults"
ENGINE_DIR = ROOT / "examples" / "engines"
REPORTS = ROOT / "reports"
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
CONTROLS = (AA, REFERENCE, AA_LARGE)
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
NICE = 5  # the machine is shared


@dataclass(frozen=True)
class RunOutcome:
    """What one `qa run` did."""

    name: str
    exit_code: int
    seconds: float
    stderr_tail: str


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
    print(f"  {name}: exit {proc.returncode} in {seconds:.0f} s{(' (' + tail + ')') if tail else ''}", flush=True)
    return RunOutcome(name, proc.returncode, seconds, tail)


def seed_arm(spec: RunSpec, run_dir: Path, source: Path, role: str = "baseline",
             calibration: bool = True) -> dict[str, str]:
    """Create `run_dir` for `spec` and copy `source`'s records/<role>/ task files that `spec` runs, with
    its arm.json listing just those tasks, and (if asked) calibration/; returns sha256 per copied file.
    The arm process still checks that the copied arm and task fingerprints match the spec's."""
    dst_rd = prepare_run_dir(spec, run_dir)
    src, dst = RunDir(source).arm_records(role), dst_rd.arm_records(role)
    if not (src / ARM_FILE).exists():
        raise SystemExit(f"error: {src} has no {ARM_FILE}: run the source spec first")
    wanted = {t.name for t in spec.tasks}
    dst.mkdir(parents=True, exist_ok=True)
    copied: dict[str, str] = {}
    for path in sorted(src.glob("*.jsonl")):
        if path.stem in wanted and path.stat().st_size > 0:
            if not (dst / path.name).exists():
                shutil.copy2(path, dst / path.name)
            copied[path.name] = sha256_file(dst / path.name)
    if not (dst / ARM_FILE).exists():
        manifest = ArmManifest.load(src / ARM_FILE)
        tasks = {name: entry for name, entry in manifest.tasks.items() if f"{name}.jsonl" in copied}
        manifest.model_copy(update={"tasks": tasks}).save(dst / ARM_FILE)
    source_scales = RunDir(source).scales.parent
    if calibration and source_scales.is_dir() and not dst_rd.scales.parent.exists():
        shutil.copytree(source_scales, dst_rd.scales.parent)
    return copied


def check_unchanged(run_dir: Path, role: str, seeded: dict[str, str]) -> bool:
    """True when every seeded record file is byte-identical after the run (the arm resumed, wrote nothing)."""
    arm = RunDir(run_dir).arm_records(role)
    return all(sha256_file(arm / name) == digest for name, digest in seeded.items())


def seed_calibration(spec: RunSpec, run_dir: Path, source: Path) -> SeededCalibration:
    """Copy calibration/ from another run directory whose spec has the same model, seed and
    [calibration] table (calibration is deterministic)."""
    other = RunDir(source).load_spec()
    if (other.model, other.seed, other.calibration) != (spec.model, spec.seed, spec.calibration):
        raise SystemExit(f"error: {source} was calibrated with another model, seed or [calibration] table")
    rd = prepare_run_dir(spec, run_dir)
    if not rd.scales.parent.exists():
        shutil.copytree(RunDir(source).scales.parent, rd.scales.parent)
    return SeededCalibration(run_dir=str(source), sha256=sha256_file(rd.scales))


def load_fault_specs(names: Sequence[str]) -> dict[str, RunSpec]:
    """The fault specs, checked to share model, seed, baseline arm, tasks and (where set) calibration,
    and each fault's candidate kv to equal its preset applied to the reference KV cache."""
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
            raise SystemExit(f"error: examples/faults/{name}.toml calibrates differently from {FAULTS[0]}.toml")
        kv = spec.arms["candidate"].given_args().get("kv")
        if name == AA:
            if kv is not None:
                raise SystemExit("error: the A/A spec's candidate must have no kv table (it is the baseline again)")
            continue
        base = kv_spec_from_dict(REFERENCE_KV)
        want = base if name == REFERENCE else fault_spec(name, base)
        if kv is None or kv_spec_from_dict(kv) != want:
            raise SystemExit(
                f"error: examples/faults/{name}.toml candidate kv is not preset {name!r} applied "
                f"to the reference {REFERENCE_KV}; expected {want.model_dump(exclude_defaults=True)}"
            )
    return {n: specs[n] for n in names}


def _finished(info: RunInfo, out: RunOutcome, run_dir: Path, seeded: dict[str, str]) -> RunInfo:
    unchanged = check_unchanged(run_dir, "baseline", seeded) if seeded else None
    if unchanged is False:
        print(f"  WARNING: {out.name}: the seeded baseline records changed: the arm re-ran", flush=True)
    return info.model_copy(update={"baseline_resumed_unchanged": unchanged, "exit_code": out.exit_code,
                                   "wall_seconds": round(out.seconds, 1), "error": out.stderr_tail or None})


def run_faults(names: Sequence[str], work: Path, data_dir: Path | None, seed_from: Path | None = None) -> None:
    """Run the fault specs (baseline once) and publish each to reports/faults/<name>/.
    `seed_from`: a run directory whose baseline records (same arm, same task options) and calibration
    (same [calibration]) the first run reuses instead of computing them."""
    specs = load_fault_specs(FAULTS)
    source = work / "faults" / FAULTS[0]
    for name in names:
        run_dir = work / "faults" / name
        info = RunInfo(spec=f"examples/faults/{name}.toml", preset=None if name in CONTROLS else name)
        seeded: dict[str, str] = {}
        if name == AA_LARGE:  # its own baseline at its own n: nothing to seed
            if "kv" in load_spec(FAULT_DIR / f"{name}.toml").arms["candidate"].given_args():
                raise SystemExit(f"error: examples/faults/{name}.toml: the A/A candidate must have no kv table")
        elif name == FAULTS[0] and seed_from is not None:
            calibration = seed_calibration(specs[name], run_dir, seed_from)
            seeded = seed_arm(specs[name], run_dir, seed_from, calibration=False)
            info = info.model_copy(update={
                "calibration_seeded_from": calibration,
                "baseline_seeded_from": f"{seed_from} (records/baseline/: {', '.join(seeded)})",
            })
        elif name != FAULTS[0]:
            seeded = seed_arm(specs[name], run_dir, source, calibration=specs[name].calibration is not None)
            info = info.model_copy(
                update={"baseline_seeded_from": f"{FAULTS[0]} run directory (records/baseline/, calibration/)"})
        out = run_qa(name, FAULT_DIR / f"{name}.toml", run_dir, data_dir, work / "logs" / f"fault-{name}.log")
        # a failed run publishes its error in run.json
        publish(run_dir, REPORTS / "faults" / name, _finished(info, out, run_dir, seeded))


def _kv_line(log: Path) -> str | None:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if "llama_kv_cache: size" in ln]
    return lines[0] if lines else None


def run_engines(names: Sequence[str], work: Path, data_dir: Path | None, seed_from: Path | None = None) -> None:
    """The real-engine reference runs; each published to reports/engines/<name>/."""
    base_dir = work / "engines"
    for name in names:
        spec_path = ENGINE_DIR / f"{name}.toml"
        spec = load_spec(spec_path)
        run_dir = base_dir / name
        info = RunInfo(spec=f"examples/engines/{name}.toml")
        seeded: dict[str, str] = {}
        if name == "vllm_nvfp4_override":
            refusal = record_refusal(spec, work, data_dir)
            seeded = seed_arm(spec, run_dir, base_dir / "vllm_bf16_vs_fp8", calibration=False)
            info = info.model_copy(update={
                "refusal": refusal, "baseline_seeded_from": "vllm_bf16_vs_fp8 run directory (records/baseline/)"})
        elif name in ("emulator_nvfp4_gsm8k", "emulator_aa_gsm8k") and seed_from is not None:
            seeded = seed_arm(spec, run_dir, seed_from, calibration=False)
            info = info.model_copy(
                update={"baseline_seeded_from": f"{seed_from} (records/baseline/: {', '.join(seeded)})"})
        out = run_qa(name, spec_path, run_dir, data_dir, work / "logs" / f"engine-{name}.log")  # starts any servers
        servers, kv_lines = {}, {}
        for role, arm in spec.arms.items():
            server_log = RunDir(run_dir).server_log(role)
            if arm.server is not None and server_log.is_file():
                servers[role] = arm.server.model_dump(exclude_defaults=True)
                kv_lines[role] = _kv_line(server_log)
        if servers:
            info = info.model_copy(update={"servers": servers, "kv_cache_log_lines": kv_lines})
        publish(run_dir, REPORTS / "engines" / name, _finished(info, out, run_dir, seeded))


def refusal_spec(spec: RunSpec) -> RunSpec:
    """`spec` with its candidate's allow_unsupported_kv_cache_dtype removed (named <name>-refused)."""
    arm = spec.arms["candidate"]
    args = {k: v for k, v in arm.given_args().items() if k != "allow_unsupported_kv_cache_dtype"}
    candidate = ArmSpec.model_validate({**arm.model_dump(), "engine_args": args})  # parsed by the engine's model
    return spec.model_copy(update={"name": spec.name + "-refused", "arms": {**spec.arms, "candidate": candidate}})


def record_refusal(spec: RunSpec, work: Path, data_dir: Path | None) -> Refusal:
    """Run the nvfp4 candidate once without allow_unsupported_kv_cache_dtype: the engine must refuse it.
    Only the candidate's arm process runs (the baseline is not needed to refuse), in a scratch folder."""
    strict = refusal_spec(spec)
    args = strict.arms["candidate"].given_args()
    scratch = work / "engines" / "vllm_nvfp4_refused"
    shutil.rmtree(scratch, ignore_errors=True)
    spec_file = work / "engines" / "vllm_nvfp4_refused.toml"
    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(dump_spec(strict), encoding="utf-8")
    resolved = resolve_run(strict, scratch, data_dir=data_dir, spec_dir=None)  # no preflight: the engine must refuse
    prepare_run_dir(strict, scratch)
    resolved.rd.save_resolved(resolved.record, resolved.policy.text)
    cmd = ["nice", "-n", str(NICE), arm_python(resolved.record.arm("candidate")), "-m", WORKER_MODULE, str(scratch),
           "candidate"]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    print(f"  refusal check: exit {proc.returncode}: {errors[-1] if errors else '(no error line)'}", flush=True)
    return Refusal(exit_code=proc.returncode, error=errors[-1] if errors else None,
                   seconds=round(time.monotonic() - start, 1), engine_args=args)
