"""Run specs: the TOML file `qa run` takes, parsed once into frozen, validated models.

Unknown keys are errors everywhere. A spec names the model, the arms (baseline, candidate and an
optional baseline rerun), each arm's engine and engine arguments, the tasks with their limits and
repeats, the seed, the gate policy, and optionally a calibration step for static KV scales.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from qa.errors import SpecError
from quant.validation import first_error

ArmRole = Literal["baseline", "candidate", "rerun"]
ARM_ROLES: tuple[ArmRole, ...] = ("baseline", "candidate", "rerun")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TaskSpec(_Frozen):
    """One task of the run; `limit` items drawn as a seeded random subset shared by every arm."""

    name: str
    limit: int | None = Field(default=None, ge=1)
    repeats: int = Field(default=1, ge=1)
    num_fewshot: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    options: dict[str, Any] = Field(default_factory=dict)


class CalibrationSpec(_Frozen):
    """Calibrate static KV scales before the candidate runs (written to <run>/calibration/)."""

    dataset: str = "wikitext2"
    n_samples: int = Field(default=16, ge=1)
    seq_len: int = Field(default=512, ge=16)
    observer: Literal["absmax", "percentile", "mse"] = "mse"
    percentile: float = Field(default=99.99, gt=0, le=100)
    granularity: Literal["tensor", "head"] = "tensor"
    format: str = "nvfp4"


class ArmSpec(_Frozen):
    """One arm: an engine with its arguments, or an existing lm-eval `--log_samples` folder."""

    engine: Literal["hf", "vllm", "openai", "lmeval"] = "hf"
    model: str | None = None  # default: the spec's model
    engine_args: dict[str, Any] = Field(default_factory=dict)
    lmeval_dir: str | None = None
    description: str = ""

    @model_validator(mode="after")
    def _lmeval_needs_dir(self) -> ArmSpec:
        if self.engine == "lmeval" and not self.lmeval_dir:
            raise ValueError("engine 'lmeval' needs lmeval_dir (an lm-eval --output_path folder)")
        if self.engine != "lmeval" and self.lmeval_dir:
            raise ValueError("lmeval_dir is only for engine 'lmeval'")
        return self


class RunSpec(_Frozen):
    """A whole run: `qa run SPEC.toml`."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    model: str = "smollm2-135m"
    seed: int = 1234
    data_dir: str | None = None
    policy: str = "default"
    trust_remote_code: bool = False
    calibration: CalibrationSpec | None = None
    arms: dict[ArmRole, ArmSpec]
    tasks: list[TaskSpec] = Field(default_factory=list)
    notes: str = ""

    @field_validator("arms")
    @classmethod
    def _needs_both(cls, arms: dict[ArmRole, ArmSpec]) -> dict[ArmRole, ArmSpec]:
        missing = [r for r in ("baseline", "candidate") if r not in arms]
        if missing:
            raise ValueError(f"missing arm(s) {', '.join(missing)}: a run compares [arms.baseline] with [arms.candidate]")
        return arms

    @model_validator(mode="after")
    def _tasks_unless_lmeval(self) -> RunSpec:
        engines = {a.engine for a in self.arms.values()}
        if not self.tasks and engines != {"lmeval"}:
            raise ValueError("no [[tasks]]: name at least one task")
        names = [t.name for t in self.tasks]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"task(s) listed twice: {', '.join(dup)}")
        return self

    def arm_model(self, role: ArmRole) -> str:
        """The model an arm serves (its own override, else the spec's)."""
        return self.arms[role].model or self.model

    def records_fingerprint(self, role: ArmRole) -> str:
        """Hash of everything that determines an arm's records (a changed one must not mix with old records)."""
        arm = self.arms[role]
        payload = {"model": self.arm_model(role), "seed": self.seed, "arm": arm.model_dump(exclude={"description"}),
                   "calibration": self.calibration.model_dump() if self.calibration and role == "candidate" else None,
                   "trust_remote_code": self.trust_remote_code}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _one_line(exc: ValidationError, source: str) -> str:
    err = first_error(exc)
    msg = err.msg
    if err.type == "extra_forbidden":
        msg = "unknown key (check the spelling; see examples/ for valid specs)"
    elif err.type == "missing":
        msg = "required key is missing"
    more = f" (and {err.more} more problem(s))" if err.more else ""
    return f"{source}: {err.where_or('(top level)')}: {msg}{more}"


def parse_spec(text: str, source: str = "spec") -> RunSpec:
    """Parse and validate a spec's TOML text; any problem is one SpecError line naming the key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{source}: not valid TOML ({exc})") from None
    try:
        return RunSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_one_line(exc, source)) from None


def load_spec(path: Path) -> RunSpec:
    """Read and validate a spec file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read spec ({exc})") from None
    return parse_spec(text, str(path))


def dump_spec(spec: RunSpec) -> str:
    """The resolved spec as TOML, every default written out (the run directory's spec.toml)."""
    import tomli_w

    data = spec.model_dump(mode="json", exclude_none=True)
    return tomli_w.dumps(data)
