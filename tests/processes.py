"""Process checks the server tests share."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0 delivers nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
