"""The run directory: `RunDir` owns every path in it and loads/saves each file with its model.

    <run>/spec.toml                 the spec, every default written out (RunSpec)
    <run>/resolved.json             what `qa run` resolved from it (qa.files.resolved_json.ResolvedRecord)
    <run>/policy.toml               the bytes of the gate policy it resolved (sha256 in resolved.json)
    <run>/env.json                  versions, git sha, hardware, model and data hashes
    <run>/calibration/kv_scales.*   static KV scales (safetensors + JSON sidecar)
    <run>/records/<arm>/*.jsonl     one SampleRecord per (item, repeat), plus arm.json
    <run>/logs/<arm>-server.log     the log of a server `qa run` started for an arm
    <run>/logs/sequential.jsonl     a sequential run's worker starts and blocks
    <run>/kv_inspect.json           per-layer KV distortion of an emulated-cache candidate
    <run>/comparison.json           numbers (qa.files.comparison), <run>/verdict.json the gate's decision
    <run>/report.md, report.html, plots/

A run whose candidates are not exactly one arm named "candidate" keeps each candidate's
kv_inspect.json, comparison.json, verdict.json, report.* and plots/ in <run>/candidates/<name>/ (a
RunDir of its own whose spec, env, calibration and records are the run's), and writes at the root a
run-level verdict.json (RunVerdict), junit.xml, summary.md and a report.md/report.html matrix.

A rerun of the same spec into the same folder resumes (finished samples are skipped); a different
spec is refused before anything is written, so a finished run is never overwritten or mixed.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from evals.provenance.server_log import server_log_path
from qa.errors import PolicyError, SpecError
from qa.files.comparison import Comparison, load_comparison, save_comparison
from qa.files.policy import Policy, parse_policy, resolve_policy
from qa.files.resolved_json import ResolvedRecord, load_resolved, save_resolved, text_sha256
from qa.files.spec import RunSpec, dump_spec, parse_spec
from qa.files.verdict import (
    RunVerdict,
    Verdict,
    load_run_verdict,
    load_verdict,
    save_run_verdict,
    save_verdict,
)
from quant.fileio import atomic_write_text, sha256_file

SPEC_FILE = "spec.toml"
RESOLVED_FILE = "resolved.json"
POLICY_FILE = "policy.toml"
CANDIDATES = "candidates"


@dataclass(frozen=True)
class RunDir:
    """Every path of one run directory, and typed load/save of its files."""

    root: Path

    @property
    def top(self) -> Path:
        """The run directory holding spec.toml: the root, or the run a candidates/<name>/ folder is in."""
        run = self.root.parent.parent
        if self.root.parent.name == CANDIDATES and (run / SPEC_FILE).is_file():
            return run
        return self.root

    def candidate(self, name: str) -> RunDir:
        """candidates/<name>/: one candidate's comparison, verdict and report (several-candidate runs)."""
        return RunDir(self.root / CANDIDATES / name)

    @property
    def spec_file(self) -> Path:
        """spec.toml: the spec with every default written out."""
        return self.top / SPEC_FILE

    @property
    def resolved(self) -> Path:
        """resolved.json: what `qa run` resolved from the spec (qa.files.resolved_json)."""
        return self.top / RESOLVED_FILE

    @property
    def policy_file(self) -> Path:
        """policy.toml: the bytes of the policy the run resolved."""
        return self.top / POLICY_FILE

    @property
    def env(self) -> Path:
        """env.json: what produced the run."""
        return self.top / "env.json"

    @property
    def scales(self) -> Path:
        """The candidates' calibrated static KV scales (stem: .safetensors + .json)."""
        return self.top / "calibration" / "kv_scales.safetensors"

    @property
    def vllm_model(self) -> Path:
        """calibration/vllm-model/: the model folder carrying the calibrated FP8 scales to vllm candidates."""
        return self.top / "calibration" / "vllm-model"

    @property
    def records(self) -> Path:
        """The folder holding one records folder per arm."""
        return self.top / "records"

    def arm_records(self, arm: str) -> Path:
        """records/<arm>/: the arm's <task>.jsonl files and arm.json."""
        return self.records / arm

    def server_log(self, arm: str) -> Path:
        """Where the server `qa run` started for an arm writes its log (evals.provenance.server_log reads it there)."""
        return server_log_path(self.top, arm)

    @property
    def sequential_log(self) -> Path:
        """logs/sequential.jsonl: every worker start and block of a sequential run (qa.pipeline.sequential)."""
        return self.top / "logs" / "sequential.jsonl"

    @property
    def kv_inspect(self) -> Path:
        """Per-layer KV-cache distortion of the candidate's emulated cache (quant.kv.inspect schema)."""
        return self.root / "kv_inspect.json"

    @property
    def comparison(self) -> Path:
        """comparison.json: numbers only."""
        return self.root / "comparison.json"

    @property
    def verdict(self) -> Path:
        """verdict.json: the gate's decision under a policy."""
        return self.root / "verdict.json"

    @property
    def junit(self) -> Path:
        """junit.xml of a several-candidate run (one testsuite per candidate)."""
        return self.root / "junit.xml"

    @property
    def step_summary(self) -> Path:
        """summary.md of a several-candidate run: the CI step summary's Markdown."""
        return self.root / "summary.md"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    def load_spec(self) -> RunSpec:
        """The spec of an existing run directory; SpecError when there is none."""
        if not self.spec_file.exists():
            raise SpecError(f"{self.root}: not a run directory (no {self.spec_file.name})")
        return parse_spec(self.spec_file.read_text(encoding="utf-8"), str(self.spec_file))

    def load_resolved(self) -> ResolvedRecord:
        """resolved.json (a one-line QAError when missing or invalid)."""
        return load_resolved(self.resolved)

    def save_resolved(self, record: ResolvedRecord, policy_text: str) -> None:
        """Write policy.toml (the policy's bytes), then resolved.json, atomically."""
        atomic_write_text(self.policy_file, policy_text)
        save_resolved(self.resolved, record)

    def recorded_policy(self) -> Policy:
        """The policy the run was resolved with: policy.toml, checked against resolved.json's sha256. A run
        directory older than resolved.json: the policy its spec.toml names ("default", else a path, relative
        to the run directory or to the working directory); PolicyError when it cannot be found."""
        if self.resolved.is_file():
            record = self.load_resolved().policy
            try:
                text = self.policy_file.read_text(encoding="utf-8")
            except OSError:
                raise PolicyError(f"{self.policy_file}: missing (resolved.json names policy {record.name!r}, "
                                  f"sha256 {record.sha256[:12]}); pass --policy") from None
            if text_sha256(text) != record.sha256:
                raise PolicyError(f"{self.policy_file}: its sha256 is not the one resolved.json records "
                                  f"({record.sha256[:12]}): the file was changed; pass --policy")
            return parse_policy(text, str(self.policy_file))
        return self._legacy_policy()

    def _legacy_policy(self) -> Policy:
        if not self.spec_file.is_file():
            return resolve_policy(None)
        try:
            ref = tomllib.loads(self.spec_file.read_text(encoding="utf-8")).get("policy", "default")
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise PolicyError(f"{self.spec_file}: not valid TOML ({exc}); pass --policy") from None
        if not isinstance(ref, str) or ref == "default":
            return resolve_policy(None)
        for base in (self.top, Path.cwd()):
            if (base / ref).is_file():
                return resolve_policy(ref, base)
        raise PolicyError(f"{self.top}: its spec.toml names policy {ref!r}, which is neither in the run directory "
                          "nor in the working directory, and the run predates resolved.json; pass --policy")

    def load_comparison(self) -> Comparison:
        """comparison.json (a one-line QAError when missing or invalid)."""
        return load_comparison(self.comparison)

    def save_comparison(self, comparison: Comparison) -> None:
        """Write comparison.json atomically."""
        save_comparison(self.comparison, comparison)

    def comparison_sha256(self) -> str:
        """sha256 of comparison.json's bytes (a verdict names the comparison it decided)."""
        return sha256_file(self.comparison)

    def load_verdict(self) -> Verdict:
        """verdict.json (a one-line QAError when missing or invalid)."""
        return load_verdict(self.verdict)

    def save_verdict(self, verdict: Verdict) -> None:
        """Write verdict.json atomically."""
        save_verdict(self.verdict, verdict)

    def load_run_verdict(self) -> RunVerdict:
        """The run-level verdict.json of a several-candidate run (a one-line QAError when missing or invalid)."""
        return load_run_verdict(self.verdict)

    def save_run_verdict(self, verdict: RunVerdict) -> None:
        """Write the run-level verdict.json atomically."""
        save_run_verdict(self.verdict, verdict)


def default_run_dir(spec: RunSpec) -> Path:
    """Where a run goes when no --out is given (ignored by git)."""
    return Path("reports") / "runs" / spec.name


def prepare_run_dir(spec: RunSpec, run_dir: Path, *, check_only: bool = False) -> RunDir:
    """Create `run_dir` with its spec.toml, or check that it already holds this same spec
    (`check_only`: refuse a folder of another run, but create nothing)."""
    rd = RunDir(run_dir)
    if rd.spec_file.exists():
        old = rd.load_spec()
        if old != spec:
            changed = sorted(k for k in RunSpec.model_fields if getattr(old, k) != getattr(spec, k))
            raise SpecError(f"{run_dir} holds another run (its spec differs in: {', '.join(changed)}); "
                            "pass a new --out folder, or delete that folder to start over")
        return rd
    if run_dir.exists() and any(run_dir.iterdir()):
        raise SpecError(f"{run_dir} is not empty and holds no {rd.spec_file.name}; pass a new --out folder")
    if not check_only:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(rd.spec_file, dump_spec(spec))
    return rd
