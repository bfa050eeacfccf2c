"""GPQA from the authors' password-protected `dataset.zip`, decrypted in memory only.

Rein et al. 2023, arXiv:2311.12022. The zip keeps the questions out of web crawls; its question
text is never printed, logged or written here: errors name the file, the zip member and at most
a Record ID.
"""

from __future__ import annotations

import functools
import zipfile
import zlib
from pathlib import Path

from evals.data.files import check_count, read_csv_text, require_file
from evals.data.spec import Reader, Row, Split
from evals.errors import DataError

# The password the GPQA authors publish for dataset.zip (idavidrein/gpqa README, quoted in
# shared/data/MANIFEST.md). It keeps the questions out of web crawls, not a secret.
GPQA_ZIP_PASSWORD = b"deserted-untie-orchid"

GPQA_COLUMNS = (
    "Record ID",
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
)


def gpqa_member(subset: str) -> str:
    """The zip member holding one subset's CSV."""
    return f"dataset/gpqa_{subset}.csv"


@functools.lru_cache(maxsize=4)
def _decrypt_member(path: str, size: int, mtime_ns: int, member: str, password: bytes) -> bytes:
    """One zip member's bytes, kept in memory: ZipCrypto is decrypted in pure Python (seconds per
    file), and the (size, mtime) key re-reads a file that changed."""
    with zipfile.ZipFile(path) as zf:
        return zf.read(member, pwd=password)


def read_gpqa(path: Path, subset: str, password: bytes = GPQA_ZIP_PASSWORD) -> list[Row]:
    """Rows of gpqa_<subset>.csv, decrypted from GPQA's dataset.zip in memory (nothing written or printed);
    id = the Record ID. The item count is checked by the registry's reader, not here."""
    member = gpqa_member(subset)
    require_file(path, "GPQA's password-protected dataset.zip")
    where = f"{path}:{member}"
    stat = path.stat()
    try:
        data = _decrypt_member(str(path.resolve()), stat.st_size, stat.st_mtime_ns, member, password)
    except KeyError:
        raise DataError(f"{path}: no member {member!r}; expected the authors' GPQA dataset.zip") from None
    except RuntimeError as exc:  # zipfile: "Bad password for file ..."
        if "password" in str(exc).lower():
            raise DataError(
                f"{where}: wrong zip password; expected the GPQA authors' published password"
            ) from None
        raise DataError(f"{where}: cannot read ({exc})") from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        # A wrong password passes ZipCrypto's 1-byte check 1 time in 256 and then fails here.
        raise DataError(
            f"{where}: cannot decrypt or inflate ({type(exc).__name__}); wrong password or corrupt zip"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{where}: not UTF-8 text; wrong password or corrupt zip") from None
    return [{"id": r["Record ID"], **r} for r in read_csv_text(text, where, GPQA_COLUMNS)]


def gpqa_reader(subset: str) -> Reader:
    """The registry reader for one GPQA subset: `read_gpqa` on the split's zip, count checked."""

    def read(root: Path, split: Split) -> list[Row]:
        path = root / split.files[0]
        return check_count(read_gpqa(path, subset), split, f"{path}:{gpqa_member(subset)}")

    return read
