"""What a committed file may name: no path of the machine it was made on. A run folder, a report or a
benchmark log is committed and read elsewhere, so the paths written into it are relative to the repository
(or its workspace), the home folder is `~` and a temporary folder is its own name (`portable_text`), and a
test checks every committed report, example and document for a machine path left over (`machine_paths`)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

# Roots that name one machine: a workspace, a home folder, a temporary or mounted folder.
MACHINE_PATH = re.compile(r"(?<![\w.~:/-])/(?:work|root|home/[^/\s]+|Users/[^/\s]+|tmp|mnt|var/folders)/[^\s\"'<>),]*")


def portable_text(text: str, repo: Path) -> str:
    """`text` with this machine's paths rewritten: the repository's root dropped (paths relative to it), its
    parent folder (the workspace) dropped, the home folder as `~`, the temporary folder dropped."""
    repo = repo.resolve()
    rules = [(f"{repo}/", ""), (f"{repo.parent}/", ""), (f"{Path.home()}/", "~/"),
             (f"{Path(tempfile.gettempdir()).resolve()}/", ""), ("/tmp/", "")]
    for old, new in sorted(rules, key=lambda r: -len(r[0])):  # the longest root first
        if old != "/":
            text = text.replace(old, new)
    return text


def machine_paths(text: str) -> list[str]:
    """The machine paths `text` names (MACHINE_PATH), in order."""
    return [m.group(0) for m in MACHINE_PATH.finditer(text)]


def portable_dir(folder: Path) -> str:
    """A folder as a committed file may name it: relative to the working directory when inside it, else its
    own name (a report's run folder)."""
    try:
        return str(folder.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return folder.name
