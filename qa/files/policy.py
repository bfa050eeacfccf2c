"""Gate policy: which rule decides each task, with which margin, alpha and error budget.

A policy is a TOML file parsed once into frozen, validated models; unknown keys are errors. It is
fixed before the run (margins chosen after seeing the data are not a test). Layout:

    version = 1
    require = ["gsm8k"]                 # tasks that must be present in the comparison
    require_scales = false              # true: a candidate meant to use calibrated K/V scales that ran
                                        # with defaulted 1.0 scales fails (else: a warning)

    [default]                           # applies to every task
    rules = ["noninferiority"]          # any of noninferiority | tost | sigma; all listed must pass
    margin = 0.02                       # metric units: 0.02 = 2 accuracy points
    alpha = 0.05                        # one-sided; NI and TOST read the two-sided 90% CI
    ...

    [tasks.gsm8k]                       # per-task overrides of any [default] key
    metric = "exact_match,strict-match"
"""

from __future__ import annotations

import hashlib
import tomllib
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from qa.errors import PolicyError
from quant.validation import did_you_mean, first_error

POLICY_VERSION = 1
DEFAULT_POLICY_NAME = "default.toml"

Rule = Literal["noninferiority", "tost", "sigma"]
SEBasis = Literal["baseline", "unpaired", "paired"]
Underpowered = Literal["inconclusive", "fail"]
ReferenceGate = Literal["when_no_information", "always", "instead_of_accuracy", "never"]  # qa.gate.reference
RULES: tuple[str, ...] = ("noninferiority", "tost", "sigma")
SPENDING: tuple[str, ...] = ("obrien_fleming", "pocock", "confidence_sequence")  # qa.stats.sequential computes them

# When a task has several (metric, filter) estimates and the policy names none, the first of
# these that the task has is gated: lm-eval's headline metric for MC and generative tasks.
AUTO_METRICS: tuple[str, ...] = (
    "acc,none",
    "exact_match,strict-match",
    "exact_match,flexible-extract",
    "exact_match,none",
    "acc_norm,none",
)


class TaskPolicy(BaseModel):
    """The fully resolved policy for one task (defaults merged with the task's overrides)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    rules: tuple[Rule, ...] = ("noninferiority",)
    metric: str | None = None
    margin: float = Field(default=0.02, gt=0)
    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    power: float = Field(default=0.8, gt=0, lt=1)
    sigma_k: float = Field(default=1.5, gt=0)
    sigma_basis: SEBasis = "baseline"
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    min_n: int = Field(default=50, ge=1)
    underpowered: Underpowered = "inconclusive"
    improvement_is_warning: bool = True
    gate_truncation: bool = True  # the truncation rule decides (else it is only reported)
    truncation_margin: float = Field(default=0.02, gt=0, le=1)  # largest tolerated rise of the truncation rate
    # sequential looks
    looks: tuple[float, ...] = ()  # information fractions of the sequential looks, e.g. (0.25, 0.5, 0.75, 1.0); () = fixed n
    spending: str = "obrien_fleming"  # one of SPENDING: obrien_fleming | pocock | confidence_sequence
    # the reference-answer signal
    reference_gate: ReferenceGate = "when_no_information"  # when the reference-answer signal decides
    reference_logprob_margin: float = Field(default=0.25, gt=0)  # nats/token: largest tolerated mean drop
    reference_kl_margin: float = Field(default=0.25, gt=0)  # nats/token: largest tolerated mean KL
    # the cache path (warm / cold serving)
    gate_cache_path: bool = True  # the cache-path rules of a sessions task decide (else they are only reported)
    # which decide (qa.gate.cache_path): "warm_path" the candidate's warm path against the baseline's cold
    # path, drift reported beside it; "drift" also the warm/cold drift (hit rate, excess flips, KL)
    cache_gate: Literal["warm_path", "drift"] = "warm_path"
    cache_kl_margin: float = Field(default=0.01, gt=0)  # nats/token: tolerated excess of KL(cold || warm) over the baseline's
    # under load (qa.gate.batch_invariance): largest tolerated excess of the candidate's rate of items whose outcome
    # changes between concurrency 1 and N over the baseline's; None: reported only
    batch_invariance_margin: float | None = Field(default=None, gt=0, le=1)

    @field_validator("rules")
    @classmethod
    def _rules_nonempty_unique(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("list at least one rule (noninferiority, tost, sigma)")
        if len(set(v)) != len(v):
            raise ValueError("a rule is listed twice")
        return v

    @field_validator("looks", mode="before")
    @classmethod
    def _looks_as_floats(cls, v: object) -> object:
        # TOML writes 1 for 1.0; a strict float field would refuse the int (a list: verdict.json's policy)
        if isinstance(v, tuple | list):
            return tuple(float(x) if isinstance(x, int) and not isinstance(x, bool) else x for x in v)
        return v

    @field_validator("looks")
    @classmethod
    def _looks_increasing(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if v and (any(not 0 < b <= 1 or b <= a for a, b in zip((0.0, *v), v, strict=False)) or v[-1] != 1.0):
            raise ValueError(f"must be strictly increasing in (0, 1] and end at 1.0, e.g. [0.25, 0.5, 0.75, 1.0] (got {list(v)})")
        return v

    @field_validator("spending")
    @classmethod
    def _spending_known(cls, v: str) -> str:
        if v not in SPENDING:
            raise ValueError(f"unknown spending function; {did_you_mean(v, SPENDING, listing='one of')}")
        return v

    @field_validator("metric")
    @classmethod
    def _metric_has_filter(cls, v: str | None) -> str | None:
        if v is not None and (v.count(",") != 1 or not all(v.split(","))):
            raise ValueError("write the metric as 'metric,filter' like lm-eval (e.g. 'acc,none')")
        return v


_OVERRIDE_KEYS = tuple(TaskPolicy.model_fields)


class Policy(BaseModel):
    """A whole gate policy: defaults, the resolved policy of each named task, the required tasks."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    version: Literal[1] = POLICY_VERSION
    name: str = "custom"
    require: tuple[str, ...] = ()
    # a candidate meant to run with calibrated/checkpoint K/V scales that ran with defaulted 1.0 scales:
    # a failure when true, else a warning (qa.gate.provenance)
    require_scales: bool = False
    default: TaskPolicy = TaskPolicy()
    tasks: dict[str, TaskPolicy] = Field(default_factory=dict)

    def for_task(self, task: str) -> TaskPolicy:
        """The resolved policy of `task`: its own entry, else [default]."""
        return self.tasks.get(task, self.default)

    def sha256(self) -> str:
        """Hash of the resolved policy (recorded in verdict.json so a verdict names its policy)."""
        return hashlib.sha256(self.model_dump_json().encode("utf-8")).hexdigest()


def _check_keys(table: dict[str, object], allowed: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise PolicyError(f"{where}: unknown key {key!r}; {did_you_mean(key, allowed, listing='allowed')}")



def _one_line(exc: ValidationError, source: str, prefix: str) -> PolicyError:
    err = first_error(exc)
    msg = err.msg.replace("a valid tuple", "a list")
    value = err.input
    shown = "" if isinstance(value, dict | list | tuple) or value is None else f" (got {value!r})"
    return PolicyError(f"{source}: {f'{prefix} {err.where}'.strip()}: {msg}{shown}")


def _lists_as_tuples(table: dict[str, object]) -> dict[str, object]:
    # TOML has arrays, the frozen models hold tuples; nothing else is converted (strict models).
    return {k: tuple(v) if isinstance(v, list) else v for k, v in table.items()}


def _table(data: dict[str, object], key: str, source: str) -> dict[str, object]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise PolicyError(f"{source}: '{key}' must be a table ([{key}])")
    return _lists_as_tuples(value) if key == "default" else value


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Parse and validate a policy TOML string; any problem is one PolicyError line naming `source`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML ({exc})") from None
    _check_keys(data, tuple(Policy.model_fields), source)
    default_table = _table(data, "default", source)
    _check_keys(default_table, _OVERRIDE_KEYS, f"{source}: [default]")
    try:
        default = TaskPolicy.model_validate(default_table)
    except ValidationError as exc:
        raise _one_line(exc, source, "[default]") from None
    tasks: dict[str, TaskPolicy] = {}
    for task, table in _table(data, "tasks", source).items():
        if not isinstance(table, dict):
            raise PolicyError(f"{source}: tasks.{task} must be a table ([tasks.{task}])")
        _check_keys(table, _OVERRIDE_KEYS, f"{source}: [tasks.{task}]")
        try:
            tasks[task] = TaskPolicy.model_validate({**default.model_dump(), **_lists_as_tuples(table)})
        except ValidationError as exc:
            raise _one_line(exc, source, f"[tasks.{task}]") from None
    top = _lists_as_tuples({k: v for k, v in data.items() if k not in ("default", "tasks")})
    try:
        return Policy.model_validate({**top, "default": default, "tasks": tasks})
    except ValidationError as exc:
        raise _one_line(exc, source, "") from None


def load_policy(path: Path | None = None) -> Policy:
    """Read a policy file; None loads the shipped default policy."""
    return parse_policy(policy_text(path), str(path) if path is not None else f"qa/policies/{DEFAULT_POLICY_NAME}")


def default_policy_text() -> str:
    """The TOML text of the shipped default policy (qa/policies/default.toml)."""
    return resources.files("qa").joinpath("policies", DEFAULT_POLICY_NAME).read_text(encoding="utf-8")


def default_policy() -> Policy:
    """The shipped default: non-inferiority at a 2-point margin, always reporting the 1.5-SE rule."""
    return load_policy(None)


def policy_path(ref: str | Path | None, relative_to: Path | None = None) -> Path | None:
    """The file a spec or the CLI names as its policy: None for None or "default" (the shipped default);
    else a TOML path, as given when it exists or is absolute, else relative to `relative_to`."""
    if ref is None or str(ref) == "default":
        return None
    path = Path(ref)
    if not path.is_absolute() and relative_to is not None and not path.exists():
        path = relative_to / path
    return path


def policy_text(path: Path | None) -> str:
    """The TOML text of a policy file (None: the shipped default); PolicyError when there is no such file."""
    if path is None:
        return default_policy_text()
    if not path.is_file():
        raise PolicyError(f"{path}: no such policy file; pass --policy PATH or omit it for the shipped default")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{path}: cannot read the policy ({exc})") from None


def resolve_policy(ref: str | Path | None, relative_to: Path | None = None) -> Policy:
    """The policy a spec or the CLI names (`policy_path`), parsed."""
    return load_policy(policy_path(ref, relative_to))
