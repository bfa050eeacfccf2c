"""Where the toolkit keeps what it derives from its inputs (converted models, assembled GGUF files, scale fits):
`$QA_CACHE_DIR`, default `~/.cache/accuracy-parity`."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Folder for converted models and other derived artefacts."""
    return Path(os.environ.get("QA_CACHE_DIR", Path.home() / ".cache" / "accuracy-parity"))
