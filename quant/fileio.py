"""File helpers every package may import: atomic replacement, sha256 of a file's bytes, and the objects of a
JSON-lines file with a one-line error naming the line that is not one."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

HASH_BLOCK = 1 << 20  # bytes read per step when hashing (1 MiB: large GGUF files never sit in memory)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a reader sees either the old or the new file, never a torn one
    (temp file in the same folder, fsync, rename, fsync of the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_text(path: Path, text: str) -> None:
    """`atomic_write_bytes` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in HASH_BLOCK steps."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(HASH_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def scales_paths(path: Path) -> tuple[Path, Path]:
    """(`<stem>.safetensors`, `<stem>.json`) for a path given with either suffix or none."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in (".safetensors", ".json") else path
    return stem.with_name(stem.name + ".safetensors"), stem.with_name(stem.name + ".json")


def jsonl_objects(lines: Iterable[str], where: Path | str, error: Callable[[str], Exception], *, corrupt: str,
                  expected: str, keys: Sequence[str] = ()) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number from 1, object) of each non-blank line of a JSON-lines file, `lines` as read from `where`
    (split at newlines only: JSON may hold other line separators). A line that is not JSON raises
    error("<where>:<n>: not valid JSON (<why>); <corrupt>"), one that is not an object with `keys`
    error("<where>:<n>: <expected>")."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{where}:{lineno}: not valid JSON ({exc.msg}); {corrupt}") from None
        if not isinstance(obj, dict) or any(k not in obj for k in keys):
            raise error(f"{where}:{lineno}: {expected}")
        yield lineno, obj
