"""Read comparison.json schema 1 (written before the gate became the only place that decides):
its numbers are carried over into schema 2 in memory, its verdict fields dropped.

Schema 1 stored per estimate a sigma-rule, non-inferiority and TOST result computed at the
comparison's margin, plus MDE and items needed: decisions under one policy. Schema 2 keeps only
numbers; what schema 1 lacks is derived where it is exact (per-item sds of an unclustered arm from its
SE, discordant items of a single-repeat task from McNemar or the flips) and left unknown otherwise.
"""

from __future__ import annotations

import math
from typing import Any

DROPPED_FIELDS = ("sigma_rule", "noninferiority", "tost", "mde", "n_needed", "repeats_needed", "information")
# notes that were decisions under schema 1's margin; the gate now writes its own
DECISION_NOTES = ("no information", "the CI alone would pass", "candidate better by more than the margin")


def _sd(se: float | None, n: int, clustered: bool) -> float | None:
    if se is None:
        return None
    if not clustered:
        return se * math.sqrt(n)
    return 0.0 if se == 0 else None


def migrate_estimate(e: dict[str, Any]) -> dict[str, Any]:
    """One schema-1 estimate as a schema-2 estimate (see the module docstring)."""
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
    """A whole schema-1 comparison.json document as schema 2."""
    settings = data.get("settings") or {}
    return {
        **{k: v for k, v in data.items() if k not in ("schema_version", "settings", "estimates")},
        "schema_version": 2,
        "settings": {k: settings[k] for k in ("bootstrap_n", "seed", "tango_max_discordant") if k in settings},
        "estimates": [migrate_estimate(e) for e in data.get("estimates", [])],
    }
