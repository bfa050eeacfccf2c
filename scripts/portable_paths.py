"""Rewrite this machine's paths out of committed text files (qa.files.portable.portable_text): by default the
files under reports/; `--check` only lists the machine paths left (exit 1 when there are any).

resolved.json names files outside its run folder as "{run}/" + a path relative to the folder it was written in
(qa.files.resolved_json). A run made in reports/runs/<name>/ (or in another clone) and committed under
reports/<group>/<name>/ keeps paths relative to where it ran: they point next to the repository, or climb
above the workspace to the filesystem root (a machine path in disguise). Each such path is re-based on the
committed folder: to the repository file the path's tail names (.venv/bin/python, examples/...), to the
workspace's shared/ folder (the data, as QA_DATA_DIR=../shared/data), or, for the policy, to the repository
file with the same name and the sha256 resolved.json records; a path none of these finds is listed as left.

Run: .venv/bin/python -m scripts.portable_paths [--check] [FOLDER ...]"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import posixpath
import sys
from pathlib import Path
from typing import Any

from qa.files.portable import machine_paths, portable_text
from qa.files.resolved_json import RUN_MARK

REPO = Path(__file__).resolve().parent.parent
SHARED = "shared"  # the workspace folder beside the repository that holds the data (README: ../shared/data)


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


def workspace_path(run_dir: Path, value: str, repo: Path = REPO) -> str:
    """A "{run}/" path as a path relative to the workspace (the repository's parent), resolved lexically
    against `run_dir`; it starts with ".." when it climbs out of the workspace."""
    here = posixpath.relpath(os.path.abspath(run_dir), os.path.dirname(os.path.abspath(repo)))
    return posixpath.normpath(posixpath.join(here, value[len(RUN_MARK):]))


def portable_target(run_dir: Path, value: str, repo: Path = REPO) -> bool:
    """Whether a "{run}/" path stays in the repository or in the workspace's shared/ folder."""
    where = workspace_path(run_dir, value, repo)
    return where.split("/")[0] in (Path(os.path.abspath(repo)).name, SHARED)


def same_bytes(repo: Path, name: str, sha256: str) -> list[Path]:
    """The repository's files called `name` whose sha256 is `sha256` (hidden folders and reports/ left out)."""
    out = []
    for folder, dirs, files in os.walk(repo):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "reports")
        if name in files and hashlib.sha256((Path(folder) / name).read_bytes()).hexdigest() == sha256:
            out.append(Path(folder) / name)
    return out


def rebased(run_dir: Path, value: str, sha256: str | None = None, repo: Path = REPO) -> str | None:
    """`value` re-based on `run_dir` (module docstring), or None when nothing in the repository or the
    workspace's shared/ folder matches it. `sha256`: the policy file's, to find the policy by its bytes."""
    parts = [p for p in value[len(RUN_MARK):].split("/") if p not in ("", ".", "..")]
    target = None
    for i in range(len(parts)):
        tail = "/".join(parts[i:])
        if (repo / tail).exists():
            target = repo / tail
            break
        if parts[i] == SHARED:
            target = repo.parent / tail
            break
    if target is None and sha256 is not None and parts:
        same = same_bytes(repo, parts[-1], sha256)
        target = same[0] if same else None
    if target is None:
        return None
    return RUN_MARK + posixpath.relpath(os.path.abspath(target), os.path.abspath(run_dir))  # links kept as named


def run_paths(data: dict[str, Any]) -> list[tuple[str, str | None]]:
    """Every "{run}/" string of a resolved.json's data with the sha256 that names its file (the policy's) or
    None."""
    out: list[tuple[str, str | None]] = []

    def walk(node: Any, sha: str | None) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, node.get("sha256") if key == "path" else None)
        elif isinstance(node, list):
            for value in node:
                walk(value, None)
        elif isinstance(node, str) and node.startswith(RUN_MARK):
            out.append((node, sha))

    walk(data, None)
    return out


def fix_resolved(path: Path, check: bool, repo: Path = REPO) -> tuple[bool, list[str]]:
    """Re-base the paths of one resolved.json that leave the repository and its shared/ folder; (changed,
    paths left). The file keeps its bytes but for the paths' text."""
    text = path.read_text(encoding="utf-8")
    changed, left = False, []
    for value, sha in run_paths(json.loads(text)):
        if portable_target(path.parent, value, repo):
            continue
        new = None if check else rebased(path.parent, value, sha, repo)
        if new is None:
            left.append(value)
            continue
        text, changed = text.replace(json.dumps(value), json.dumps(new)), True
    if changed:
        path.write_text(text, encoding="utf-8")
    return changed, left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.portable_paths", description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, default=[REPO / "reports"])
    parser.add_argument("--check", action="store_true", help="list machine paths, change nothing")
    ns = parser.parse_args(argv)
    changed, left = 0, 0
    for path in text_files(ns.folders):
        outside: list[str] = []
        touched = False
        if path.name == "resolved.json":  # first: portable_text would cut a "{run}/" path that climbs past "/"
            touched, outside = fix_resolved(path, ns.check)
        text = path.read_text(encoding="utf-8")
        if not ns.check and (new := portable_text(text, REPO)) != text:
            path.write_text(new, encoding="utf-8")
            text, touched = new, True
        found = machine_paths(text) + outside
        changed += touched
        for where in found:
            left += 1
            print(f"{path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path}: {where}")
    print(f"{changed} files rewritten, {left} machine paths left", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
