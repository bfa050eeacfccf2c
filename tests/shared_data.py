"""Where tests find the offline benchmark data: $QA_DATA_DIR, else ../shared/data beside the repo."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_data_dir(needs: str = "") -> Path:
    """The data folder; skips the test when it (or the file or folder `needs` inside it) is missing."""
    value = os.environ.get("QA_DATA_DIR") or (str(SHARED_DATA) if SHARED_DATA.is_dir() else "")
    if not value or (needs and not (Path(value) / needs).exists()):
        pytest.skip(f"the shared data folder{f' with {needs}' if needs else ''} is not available (set QA_DATA_DIR)")
    return Path(value).resolve()  # tests run subprocesses in other folders
