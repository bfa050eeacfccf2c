"""Rewrite, in place, every comparison.json of schema 1 in the current schema; running it again changes nothing.

Schema 1 was written before the gate became the only place that decides: per estimate it stored a sigma-rule,
non-inferiority and TOST result computed at the comparison's margin, plus MDE and items needed, decisions
under one policy. The current schema keeps only numbers. The migration drops those fields and the notes that
were such decisions, keeps every number, derives what schema 1 lacks where it is exact (per-item sds of an
unclustered arm from its SE, discordant items of a single-repeat task from McNemar or the flips) and leaves
the rest unknown (None). qa.files.comparison.load_comparison refuses a schema-1 file and names this script.

The migrated comparison is written by the project's writer (qa.files.comparison.save_comparison: the bytes every
run writes). The run's verdict.json names the sha256 of the comparison it decided, and its report.md /
report.html print it: in those files of the same folder the old sha256 is replaced by the new one, nothing else
(scripts.fix_better_sign.rename_comparison_sha). The gate reads the same numbers before and after
(tests/qa/gate/test_committed_reports.py re-gates every committed run to its recorded status). A schema-1 file
still counting a lower-is-better metric's items by sign is refused: run `python -m scripts.fix_better_sign` on it
first.

usage: .venv/bin/python -m scripts.migrate_comparisons [FOLDER ...]
FOLDER defaults to reports/ without reports/runs/ (local runs: name that folder to migrate them); prints one line
per file migrated and `error: ...` with exit 2 for a file it cannot migrate (files before it stay migrated).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from qa.files.comparison import COMPARISON_SCHEMA_VERSION, Comparison, save_comparison
from quant.fileio import sha256_file
from quant.validation import first_error
from scripts.fix_better_sign import FixError, fix, rename_comparison_sha

ROOT = Path(__file__).resolve().parents[1]

OLD_SCHEMA = 1
DROPPED_FIELDS = ("sigma_rule", "noninferiority", "tost", "mde", "n_needed", "repeats_needed", "information")
# notes that were decisions under schema 1's margin; the gate now writes its own
DECISION_NOTES = ("no information", "the CI alone would pass", "candidate better by more than the margin")
KEPT_SETTINGS = ("bootstrap_n", "seed", "tango_max_discordant")  # schema 1's margin, alpha, k, ... were policy


class MigrateError(Exception):
    """A file this script cannot migrate (one line)."""


def _sd(se: float | None, n: int, clustered: bool) -> float | None:
    """Per-item sd from an arm's SE: exact (se * sqrt(n)) only when the SE is unclustered, or 0."""
    if se is None:
        return None
    if not clustered:
        return se * math.sqrt(n)
    return 0.0 if se == 0 else None


def migrate_estimate(e: dict[str, Any]) -> dict[str, Any]:
    """One schema-1 estimate as a current-schema estimate (see the module docstring)."""
    out = {k: v for k, v in e.items() if k not in DROPPED_FIELDS}
    n = int(e.get("n", 0))
    clustered = int(e.get("n_clusters", n)) < n
    out["sd_baseline"] = _sd(e.get("se_baseline"), n, clustered)
    out["sd_candidate"] = _sd(e.get("se_candidate"), n, clustered)
    means = [abs(m) for m in (e.get("mean_baseline"), e.get("mean_candidate")) if m is not None]
    out["score_range"] = max([1.0, *means])
    mcn = e.get("mcnemar")
    if mcn is not None:
        out["mcnemar"] = ({**{k: mcn[k] for k in ("n10", "n01", "p_exact", "p_midp")}, "unit": "item",
                           "method": "mcnemar"} if mcn.get("unit") == "item" else None)
    counts = mcn if mcn is not None and mcn.get("unit") == "item" else e.get("flips")
    if int(e.get("repeats", 0)) <= 1 and counts is not None:
        out["items_worse"], out["items_better"] = int(counts["n10"]), int(counts["n01"])
    mult = e.get("multiplicity")
    if mult is not None:
        out["multiplicity"] = {"p_diff": mult.get("p_diff"), "q_bh": mult.get("q_bh")}
    out["notes"] = [n for n in e.get("notes", []) if not n.startswith(DECISION_NOTES)]
    return out


def migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A whole schema-1 comparison.json document in the current schema, as plain JSON data."""
    settings = data.get("settings") or {}
    return {
        **{k: v for k, v in data.items() if k not in ("schema_version", "settings", "estimates")},
        "schema_version": COMPARISON_SCHEMA_VERSION,
        "settings": {k: settings[k] for k in KEPT_SETTINGS if k in settings},
        "estimates": [migrate_estimate(e) for e in data.get("estimates", [])],
    }


def migrate_file(path: Path) -> bool:
    """Migrate one comparison.json in place (and the sha256 its folder's files name); False: not schema 1."""
    raw = path.read_bytes()
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise MigrateError(f"{path}: not valid JSON ({exc.msg})") from None
    if not isinstance(doc, dict) or doc.get("schema_version") != OLD_SCHEMA:
        return False
    by_sign: list[str] = []
    fix(doc, "", by_sign)  # only to find them: fix_better_sign owns that rewrite
    if by_sign:
        raise MigrateError(f"{path}: estimate {by_sign[0]} counts items by sign; run `python -m scripts.fix_better_sign` first")
    try:
        comparison = Comparison.model_validate(migrate_v1(doc))
    except ValidationError as exc:
        err = first_error(exc)
        raise MigrateError(f"{path}: not a schema-1 comparison this script can read ({err.where}: {err.msg})") from None
    save_comparison(path, comparison)
    rename_comparison_sha(path.parent, hashlib.sha256(raw).hexdigest(), sha256_file(path))
    return True


def comparison_files(folders: list[Path]) -> list[Path]:
    """Every comparison.json under `folders`, sorted."""
    return sorted(p for folder in folders for p in folder.rglob("comparison.json"))


def main(argv: list[str]) -> int:
    reports = ROOT / "reports"
    folders = [Path(a) for a in argv] or sorted(p for p in reports.iterdir() if p.is_dir() and p.name != "runs")
    try:
        for path in comparison_files(folders):
            if migrate_file(path):
                print(f"{path}: schema {OLD_SCHEMA} -> {COMPARISON_SCHEMA_VERSION}")
    except (MigrateError, FixError, OSError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
