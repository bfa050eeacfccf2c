"""File helpers every package may import: atomic replacement, a file or folder built once across processes
(publish_once), sha256 of a file's bytes, and the objects of a JSON-lines file with a one-line error naming the
line that is not one."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HASH_BLOCK = 1 << 20  # bytes read per step when hashing (1 MiB: large GGUF files never sit in memory)
BUILD_SUFFIX = ".building"  # publish_once's work folders beside their target: `.<name>.<random>.building`


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
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """`atomic_write_bytes` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def fsync_dir(folder: Path) -> None:
    """Flush a folder's entries (a rename into it) to disk."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextmanager
def file_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the block: another holder makes this one wait,
    calling `on_wait` first. The kernel releases the lock when its holder exits, however it exits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def publish_once(target: Path, build: Callable[[Path], object], on_wait: Callable[[], None] | None = None) -> Path:
    """`target` (a file or a folder), built by `build(path)` only when missing: `build` writes `path`, a fresh name
    in a work folder beside `target`, which is then renamed into place, so an existing `target` is a complete one.
    Builders take turns on the lock `.<name>.lock` beside it (a second one waits, calling `on_wait`, then reuses
    the first one's result); one that still loses the rename drops its copy and returns the winner's. Work
    folders a killed builder left are removed under the lock."""
    if target.exists():
        return target
    with file_lock(target.with_name(f".{target.name}.lock"), on_wait):
        if target.exists():
            return target
        for stale in target.parent.glob(f".{target.name}.*{BUILD_SUFFIX}"):  # no live builder: we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=BUILD_SUFFIX))
        try:
            build(work / target.name)
            try:
                os.replace(work / target.name, target)
            except OSError:  # a folder already there (a builder that ignored the lock): keep the winner's
                if not target.exists():
                    raise
            fsync_dir(target.parent)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


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
