"""Fix, in place, the comparison.json files written before "better" followed the metric's direction (issue
32); running it again changes nothing.

Before that fix qa.compare.estimate counted by the sign of d = candidate - baseline whatever the metric:
items_better = items with d > 0, items_worse = d < 0; flips' n10 / regress_rate / regress_ci95 = pairs where
the baseline scored higher, n01 / improve_rate / improve_ci95 the reverse; McNemar's n10 = items with d < 0.
For a lower-is-better metric (qa.compare.direction: nll, truncated, kld, perplexity, ...) each of those
pairs is reversed. An estimate written before the fix is known by having no `higher_is_better` field: every
estimate written since carries it. For each such estimate of a lower-is-better metric (anywhere in the file:
`estimates`, `generation[].truncation`, `cache_path[].accuracy`) this swaps

    items_better <-> items_worse, flips.n10 <-> flips.n01, flips.regress_rate <-> flips.improve_rate,
    flips.regress_ci95 <-> flips.improve_ci95, mcnemar.n10 <-> mcnemar.n01

(McNemar's p-values are symmetric in its two counts, unchanged) and adds `higher_is_better: false` just
before `ci_method`, where the schema puts it, so that Estimate.items_by_sign reads the swapped counts right
and a second run finds nothing to do. delta, its intervals and tests are about the sign and stay as they
are. A schema-1 file gets the same swap, before `python -m scripts.migrate_comparisons` rewrites it in the current schema
(taking items_worse / items_better from the fixed McNemar or flips counts). Flips keyed by a lower-is-better
metric's name outside an estimate (a cache path's per-arm flips) carry no direction to test: the script
stops with an error naming them (there are none in reports/ now).

The file is rewritten in the bytes it was written in (pydantic's JSON, indent 2, a final newline; a file that
does not round-trip through that exactly is refused, nothing written). The run's verdict.json names the
sha256 of the comparison it decided, and its report.md / report.html print it; the gate reads none of the
swapped fields (items_by_sign gives the same counts before and after; tests/qa/gate/test_committed_reports.py
re-gates every run to its recorded status) and the reports do not render them (checked on every run fixed
in reports/: `qa report` on the fixed file writes the report.md it writes on the old one but for that
sha256), so in those three files of the same folder the old sha256 is replaced by the new one, nothing else.

usage: .venv/bin/python -m scripts.fix_better_sign [REPORTS_DIR]
REPORTS_DIR defaults to reports/ (reports/withdrawn/ is left out); prints one line per file changed and
`error: ...` with exit 2 for a file it cannot fix.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pydantic_core

from qa.compare.direction import higher_is_better

ROOT = Path(__file__).resolve().parents[1]

SWAPS = (("items_better", "items_worse"),)
FLIP_SWAPS = (("n10", "n01"), ("regress_rate", "improve_rate"), ("regress_ci95", "improve_ci95"))
MARKER = "higher_is_better"
NAME_THE_SHA = ("verdict.json", "report.md", "report.html")  # files of a run folder that name comparison.json's sha256


class FixError(Exception):
    """A file this script cannot fix (one line)."""


def _swapped(obj: dict[str, Any], pairs: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """`obj` with the values of each present pair of keys exchanged, key order kept."""
    out = dict(obj)
    for a, b in pairs:
        if a in obj and b in obj:
            out[a], out[b] = obj[b], obj[a]
    return out


def _fixed_estimate(est: dict[str, Any]) -> dict[str, Any]:
    """One pre-fix estimate of a lower-is-better metric with its counts by direction (module docstring)."""
    est = _swapped(est, SWAPS)
    if isinstance(est.get("flips"), dict):
        est["flips"] = _swapped(est["flips"], FLIP_SWAPS)
    if isinstance(est.get("mcnemar"), dict):
        est["mcnemar"] = _swapped(est["mcnemar"], (("n10", "n01"),))
    out: dict[str, Any] = {}
    for key, value in est.items():
        if key == "ci_method":
            out[MARKER] = False
        out[key] = value
    if MARKER not in out:
        raise FixError("an estimate without ci_method")
    return out


def _is_estimate(obj: dict[str, Any]) -> bool:
    return isinstance(obj.get("metric"), str) and "ci_method" in obj


def fix(node: Any, where: str, changed: list[str]) -> Any:
    """`node` with every pre-fix lower-is-better estimate fixed; `changed` gets the path of each."""
    if isinstance(node, list):
        return [fix(x, f"{where}[{i}]", changed) for i, x in enumerate(node)]
    if not isinstance(node, dict):
        return node
    if _is_estimate(node) and MARKER not in node and not higher_is_better(node["metric"]):
        changed.append(f"{where} ({node['metric']})")
        node = _fixed_estimate(node)
    out = {}
    for key, value in node.items():
        if key == "flips" and isinstance(value, dict) and not _is_estimate(node):  # flips keyed by metric name
            lower = [k for k in value if not higher_is_better(k)]
            if lower:
                raise FixError(f"{where}.flips: flips of {lower[0]} (lower is better) carry no direction; fix by hand")
        out[key] = fix(value, f"{where}.{key}", changed)
    return out


def dumped(doc: Any) -> bytes:
    """The bytes comparison.json is written in: pydantic's JSON, indent 2, a final newline."""
    return pydantic_core.to_json(doc, indent=2) + b"\n"


def fix_file(path: Path) -> list[str]:
    """Fix one comparison.json in place (and the sha256 its folder's files name); the estimates changed."""
    raw = path.read_bytes()
    doc = json.loads(raw)
    if dumped(doc) != raw:
        raise FixError(f"{path}: does not round-trip through pydantic's JSON (indent 2); not touched")
    changed: list[str] = []
    new = dumped(fix(doc, "", changed))
    if not changed:
        return []
    path.write_bytes(new)
    rename_comparison_sha(path.parent, hashlib.sha256(raw).hexdigest(), hashlib.sha256(new).hexdigest())
    return changed


def rename_comparison_sha(folder: Path, old_sha: str, new_sha: str) -> None:
    """Replace comparison.json's old sha256 by its new one in the files of `folder` that name it (NAME_THE_SHA)."""
    for other in (folder / name for name in NAME_THE_SHA):
        if other.is_file() and old_sha.encode() in (data := other.read_bytes()):
            other.write_bytes(data.replace(old_sha.encode(), new_sha.encode()))


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else ROOT / "reports"
    files = sorted(p for p in root.rglob("comparison.json") if "withdrawn" not in p.relative_to(root).parts)
    try:
        for path in files:
            for where in fix_file(path):
                print(f"{path.relative_to(root)}: {where}: counts now by the metric's direction")
    except (FixError, OSError, ValueError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
