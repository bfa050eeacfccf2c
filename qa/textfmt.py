"""Text formatting shared by the gate's outputs and the report: accuracy points, percentages,
intervals, and Markdown-safe cells."""

from __future__ import annotations

import html
import math
import re

from qa.files.comparison import Interval

MD_SPECIAL = re.compile(r"([\\`*|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|\]\(|^[#>+-]|!\[)")


def pts(x: float | None, signed: bool = True) -> str:
    """Score units as accuracy points (0.021 -> '+2.1 pts'); '-' for undefined."""
    if x is None or not math.isfinite(x):
        return "-"
    return f"{100 * x:+.1f} pts" if signed else f"{100 * x:.1f} pts"


def percent(p: float | None) -> str:
    """A probability as a percentage with sensible precision ('13.4%', '0.02%', '<0.01%')."""
    if p is None or not math.isfinite(p):
        return "-"
    if p >= 0.1:
        return f"{100 * p:.1f}%"
    if p >= 1e-4:
        return f"{100 * p:.2g}%"
    return "<0.01%"


def ci_text(ci: Interval, level: float) -> str:
    """'90% CI [-1.2, +0.4] pts' for an interval in score units at a two-sided level."""
    return f"{round(100 * level)}% CI [{100 * ci.lower:+.1f}, {100 * ci.upper:+.1f}] pts"


def md_cell(text: str) -> str:
    """Text made safe for Markdown (a table cell or a list item): HTML-escaped, newlines folded,
    emphasis, code, link and table syntax backslash-escaped (intraword underscores left as they are)."""
    s = html.escape(re.sub(r"[\r\n]+", " ", text), quote=False)
    return MD_SPECIAL.sub(lambda m: "\\" + m.group(0), s)
