"""Rewrite this machine's paths out of committed text files (qa.files.portable.portable_text): by default the
files under reports/; `--check` only lists the machine paths left (exit 1 when there are any).
Run: .venv/bin/python scripts/portable_paths.py [--check] [FOLDER ...]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qa.files.portable import machine_paths, portable_text

REPO = Path(__file__).resolve().parent.parent


def text_files(folders: list[Path]) -> list[Path]:
    """Every file under `folders` that reads as UTF-8 text (plots and other binaries are skipped)."""
    out = []
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            try:
                path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, default=[REPO / "reports"])
    parser.add_argument("--check", action="store_true", help="list machine paths, change nothing")
    ns = parser.parse_args(argv)
    changed, left = 0, 0
    for path in text_files(ns.folders):
        text = path.read_text(encoding="utf-8")
        if not ns.check and (new := portable_text(text, REPO)) != text:
            path.write_text(new, encoding="utf-8")
            changed, text = changed + 1, new
        for found in machine_paths(text):
            left += 1
            print(f"{path.relative_to(REPO)}: {found}")
    print(f"{changed} files rewritten, {left} machine paths left", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
