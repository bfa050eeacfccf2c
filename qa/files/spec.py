"""Run specs: the TOML file `qa run` takes, parsed once into frozen, validated models.

Unknown keys are errors everywhere. A spec names the model, the arms (`baseline`, one or more
candidates under any names, and an optional baseline `rerun`: the A/A floor of every candidate), each
arm's engine and engine arguments, the tasks with their limits and repeats, the seed, the gate policy,
and optionally a calibration step for static KV scales.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from evals.engines import ENGINE_NAMES, parse_engine_args
from evals.engines.args import EngineArgs
from evals.engines.openai_api.args import OpenAIArgs
from evals.engines.vllm.args import RESERVED_SERVER_ARGS, VllmFlag
from evals.errors import EvalError
from qa.errors import SpecError
from quant.kv.spec import KVQuantSpec
from quant.validation import first_error

ArmRole = str  # an arm's name: "baseline", "rerun", or a candidate's name
FIXED_ROLES = ("baseline", "rerun")  # every other arm is a candidate
LEGACY_CANDIDATE = "candidate"  # the one candidate of a run laid out as before several candidates existed
ARM_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,47}$"  # names a records folder and a candidates/<name> folder
RESERVED_NAMES = ("calibrate", "kv-inspect", "candidates")  # worker steps and the per-candidate folder


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


ChatKwarg = str | int | float | bool


class ChatSettings(_Frozen):
    """How prompts are formatted for a chat/instruct/reasoning model (lm-eval's --apply_chat_template,
    --system_instruction, --fewshot_as_multiturn, chat_template_args), for all tasks ([chat]) or one
    task; unset keys fall back to [chat], then to plain (base-model) prompts."""

    chat: bool | None = None
    system_prompt: str | None = None
    fewshot_as_multiturn: bool | None = None
    chat_template_kwargs: dict[str, ChatKwarg] | None = None  # e.g. { enable_thinking = false }
    think_tags: list[str] | None = None  # [start, end] of the reasoning part; [] turns the split off

    @field_validator("think_tags")
    @classmethod
    def _pair(cls, tags: list[str] | None) -> list[str] | None:
        if tags is not None and len(tags) not in (0, 2):
            raise ValueError("think_tags takes [start, end] (e.g. [\"<think>\", \"</think>\"]) or [] for none")
        if tags and not all(tags):
            raise ValueError("think_tags must be non-empty strings")
        return tags


class TaskSpec(ChatSettings):
    """One task of the run; `limit` items drawn as a seeded random subset shared by every arm.
    Generation settings left unset take the task's own defaults (lm-eval's generation_kwargs)."""

    name: str
    limit: int | None = Field(default=None, ge=1)
    repeats: int = Field(default=1, ge=1)
    num_fewshot: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stop: list[str] | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    reference_signal: bool = True  # teacher-force the task's reference answer (tasks that have one)


class CalibrationStep(_Frozen):
    """Calibrate static KV scales before the candidate runs (written to <run>/calibration/)."""

    dataset: str = "wikitext2"
    n_samples: int = Field(default=16, ge=1)
    seq_len: int = Field(default=512, ge=16)
    observer: Literal["absmax", "percentile", "mse"] = "mse"
    percentile: float = Field(default=99.99, gt=0, le=100)
    granularity: Literal["tensor", "head"] = "tensor"
    format: str = "nvfp4"


class ServerTable(_Frozen):
    """A local server `qa run` starts for an `openai` arm (127.0.0.1, a free port) before the arm's
    tasks and stops by pid when the arm ends: llama.cpp's server (xllamacpp) or vLLM's api_server."""

    kind: Literal["llamacpp", "vllm"]
    # llama.cpp
    gguf: str | None = None  # GGUF file; default: the GGUF of the arm's named model
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = True
    rotate_kv: bool = True  # llama.cpp's Hadamard rotation of a quantized K cache
    n_ctx: int = Field(default=2048, ge=64)
    n_parallel: int = Field(default=1, ge=1)
    threads: int = Field(default=1, ge=1)  # llama.cpp's spinning thread pool stalls a busy 2-core machine
    # vLLM: api_server arguments by EngineArgs/CLI name, passed exactly (True --x, False --no-x, lists
    # nargs, tables JSON) and nothing added: on vLLM-CPU set kv_cache_memory_bytes (else 92% of RAM)
    args: dict[str, VllmFlag] = Field(default_factory=dict)
    # vLLM: the K/V format emulated inside the server (the qa_kv plugin); what vLLM can honour of it is checked
    # where the run is resolved (qa.pipeline.resolve)
    kv: KVQuantSpec | None = None
    ready_timeout_s: float | None = Field(default=None, gt=0)  # default 60 s llama.cpp, 300 s vLLM

    @model_validator(mode="after")
    def _fields_of_its_kind(self) -> ServerTable:
        # a resolved spec writes every default out, so "set" means "differs from the default"
        changed = {name for name, f in type(self).model_fields.items() if getattr(self, name) != f.get_default(
            call_default_factory=True)}
        llama_only = {"gguf", "cache_type_k", "cache_type_v", "flash_attn", "rotate_kv", "n_ctx", "n_parallel",
                      "threads"} & changed
        vllm_only = {"args", "kv"} & changed
        wrong = sorted(llama_only if self.kind == "vllm" else vllm_only)
        if wrong:
            raise ValueError(f"{', '.join(wrong)}: not a setting of a {self.kind} server")
        reserved = sorted(RESERVED_SERVER_ARGS & set(self.args))
        if reserved:
            raise ValueError(f"args.{reserved[0]}: set by `qa run` (the arm's model, 127.0.0.1, a free port); "
                             "remove it")
        return self


class ArmSpec(_Frozen):
    """One arm: an engine with its typed arguments (parsed once here, by the engine's own argument model),
    or an existing lm-eval `--log_samples` folder."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)  # `from` or from_run: dumps round-trip

    engine: Literal["hf", "vllm", "openai", "lmeval"] = "hf"
    model: str | None = None  # default: the spec's model
    engine_args: EngineArgs | None = None  # None only for an lmeval arm
    server: ServerTable | None = None  # openai arms: a local server `qa run` starts and stops
    lmeval_dir: str | None = None
    description: str = ""
    env: dict[str, str] = Field(default_factory=dict)  # environment of the arm's process (and its server)
    from_run: str | None = Field(default=None, alias="from")  # reuse this earlier run's baseline records

    @model_validator(mode="before")
    @classmethod
    def _parse_engine_args(cls, data: object) -> object:
        # engine_args is validated by the model of the arm's engine, with that engine's one-line messages
        if not isinstance(data, dict):
            return data
        engine, args = data.get("engine", "hf"), data.get("engine_args", {})
        if engine == "lmeval" or not isinstance(args, dict) or engine not in ENGINE_NAMES:
            return data
        try:
            return {**data, "engine_args": parse_engine_args(engine, args)}
        except EvalError as exc:
            raise ValueError(str(exc)) from None

    @field_serializer("engine_args")
    def _given_args(self, args: EngineArgs | None) -> dict[str, Any] | None:
        # spec.toml keeps the engine arguments the spec set (what arm.json fingerprints), not every default
        return None if args is None else args.model_dump(mode="json", exclude_unset=True)

    @model_validator(mode="after")
    def _lmeval_needs_dir(self) -> ArmSpec:
        if self.engine == "lmeval" and not self.lmeval_dir:
            raise ValueError("engine 'lmeval' needs lmeval_dir (an lm-eval --output_path folder)")
        if self.engine != "lmeval" and self.lmeval_dir:
            raise ValueError("lmeval_dir is only for engine 'lmeval'")
        if self.engine == "lmeval" and self.engine_args is not None:
            raise ValueError("engine_args: an 'lmeval' arm reads existing samples and runs no engine")
        if self.server is not None and self.engine != "openai":
            raise ValueError("server: only an 'openai' arm talks to a server `qa run` starts")
        if self.server is not None and isinstance(self.engine_args, OpenAIArgs) and self.engine_args.base_url:
            raise ValueError("engine_args.base_url: `qa run` sets it to the server it starts; remove it")
        if self.server is not None and isinstance(self.engine_args, OpenAIArgs) and self.engine_args.base_urls:
            raise ValueError("engine_args.base_urls: `qa run` starts one server for this arm; remove base_urls")
        return self

    def given_args(self) -> dict[str, Any]:
        """The engine arguments the spec set, as plain JSON values (empty for an lmeval arm)."""
        return self._given_args(self.engine_args) or {}


class RunSpec(_Frozen):
    """A whole run: `qa run SPEC.toml`."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    model: str = "smollm2-135m"
    seed: int = 1234
    data_dir: str | None = None
    policy: str = "default"
    trust_remote_code: bool = False
    calibration: CalibrationStep | None = None
    chat: ChatSettings | None = None  # chat formatting defaults for every task
    arms: dict[ArmRole, ArmSpec]
    tasks: list[TaskSpec] = Field(default_factory=list)
    notes: str = ""

    @field_validator("arms")
    @classmethod
    def _baseline_and_candidates(cls, arms: dict[ArmRole, ArmSpec]) -> dict[ArmRole, ArmSpec]:
        for name in arms:
            if not re.match(ARM_NAME_PATTERN, name) or name in RESERVED_NAMES:
                raise ValueError(f"arm name {name!r}: use a letter then letters, digits, '_' or '-' (at most 48), "
                                 f"not {', '.join(RESERVED_NAMES)}")
        if "baseline" not in arms:
            raise ValueError("missing arm baseline: a run compares [arms.baseline] with each candidate arm")
        if not [n for n in arms if n not in FIXED_ROLES]:
            raise ValueError("no candidate arm: add one, e.g. [arms.candidate] (every arm but baseline and rerun "
                             "is a candidate)")
        for name, arm in arms.items():
            if arm.from_run is not None and name != "baseline":
                raise ValueError(f"arms.{name}.from: only the baseline can be taken from an earlier run")
            if arm.from_run is not None and arm.engine == "lmeval":
                raise ValueError("arms.baseline.from: an 'lmeval' arm already reads existing samples")
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

    @property
    def candidates(self) -> list[str]:
        """The candidate arms' names, in spec order (every arm but baseline and rerun)."""
        return [n for n in self.arms if n not in FIXED_ROLES]

    @property
    def per_candidate_dirs(self) -> bool:
        """True unless the run's one candidate is named "candidate": then comparison, verdict and report
        sit at the run root as they always did; else each candidate's are in candidates/<name>/."""
        return self.candidates != [LEGACY_CANDIDATE]



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
    data = spec.model_dump(mode="json", exclude_none=True, by_alias=True)  # arms.baseline.from, as written
    return tomli_w.dumps(data)
