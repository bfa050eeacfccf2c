"""The run directory: created once per spec, refused when it holds another run.

`<run>/spec.toml` is the resolved spec. A rerun of the same spec into the same folder resumes
(finished samples are skipped); a different spec is refused before anything is written, so a
finished run is never overwritten or mixed with another.
"""

from __future__ import annotations

from pathlib import Path

from qa.errors import SpecError
from qa.spec import RunSpec, dump_spec, parse_spec
from quant.fileio import atomic_write_text

SPEC_FILE = "spec.toml"


def default_run_dir(spec: RunSpec) -> Path:
    """Where a run goes when no --out is given (ignored by git)."""
    return Path("reports") / "runs" / spec.name


def prepare_run_dir(spec: RunSpec, run_dir: Path, *, check_only: bool = False) -> Path:
    """Create `run_dir` with its spec.toml, or check that it already holds this same spec
    (`check_only`: refuse a folder of another run, but create nothing)."""
    spec_path = run_dir / SPEC_FILE
    if spec_path.exists():
        old = parse_spec(spec_path.read_text(encoding="utf-8"), str(spec_path))
        if old != spec:
            changed = sorted(k for k in RunSpec.model_fields if getattr(old, k) != getattr(spec, k))
            raise SpecError(
                f"{run_dir} holds another run (its spec differs in: {', '.join(changed)}); "
                "pass a new --out folder, or delete that folder to start over"
            )
        return run_dir
    if run_dir.exists() and any(run_dir.iterdir()):
        raise SpecError(f"{run_dir} is not empty and holds no {SPEC_FILE}; pass a new --out folder")
    if check_only:
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(spec_path, dump_spec(spec))
    return run_dir


def load_run_spec(run_dir: Path) -> RunSpec:
    """The resolved spec of an existing run directory."""
    path = run_dir / SPEC_FILE
    if not path.exists():
        raise SpecError(f"{run_dir}: not a run directory (no {SPEC_FILE})")
    return parse_spec(path.read_text(encoding="utf-8"), str(path))
