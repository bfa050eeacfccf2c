"""report.md: the same content as the HTML page, tables in Markdown, figures linked as files; every
datum passes through `qa.textfmt.md_cell` (HTML-escaped, Markdown syntax backslash-escaped)."""

from __future__ import annotations

from qa.gate.summary import STATUS_MARK
from qa.report import rows
from qa.report.batch_invariance import markdown_section as batch_invariance_section
from qa.report.examples import record_ids, redacted, truncation_mark
from qa.report.gather import ReportInputs, gated_estimate
from qa.report.notes import clip, engine_notes, floor_notes, methods, provenance, truncation_notes
from qa.report.provenance import markdown_section as kv_provenance_section
from qa.report.reference import markdown_section as reference_section
from qa.report.sequential import markdown_section as sequential_section
from qa.report.serving import markdown_section as cache_path_section
from qa.report.slices import markdown_section as slices_section
from qa.textfmt import md_cell, percent

FIGURE_TITLES = {"forest": "Forest plot of delta", "flips": "Flips"}
KV_TITLE = "Per-layer KV-cache error"


def _cell(cell: rows.Cell) -> str:
    return md_cell(cell.main) + (f"<br>{md_cell(cell.sub)}" if cell.sub else "")


def md_table(headers: tuple[str, ...] | list[str], body: list[list[str]], raw: bool = False) -> list[str]:
    """A Markdown table; cells are escaped here unless `raw` (already escaped)."""
    out = ["| " + " | ".join(md_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(c if raw else md_cell(c) for c in r) + " |" for r in body]
    return out


def _kv_section(inp: ReportInputs, figure: str | None) -> list[str]:
    if inp.kv is None and inp.kv_problem is None:
        return []
    lines = ["", f"## {KV_TITLE}", ""]
    if inp.kv is None:
        return lines + [f"kv_inspect.json could not be shown: {md_cell(inp.kv_problem or '')}"]
    lines += [md_cell(rows.kv_caption(inp.kv)), ""] + md_table(rows.KV_HEADERS, rows.kv_rows(inp.kv))
    if figure is not None:
        lines += ["", f"![{KV_TITLE}]({figure})"]
    return lines


def _examples(inp: ReportInputs) -> list[str]:
    out = []
    for task, exs in inp.examples.items():
        if exs and redacted(task):
            out.append(f"- {md_cell(task)} (record ids only): {md_cell(record_ids(exs))}")
            continue
        for e in exs:
            out.append(
                f"- {md_cell(task)} {md_cell(e.item_id)}#{e.repeat} {e.direction}: target {md_cell(clip(e.target))}; "
                f"baseline {md_cell(clip(e.extracted_baseline))}; candidate {md_cell(clip(e.extracted_candidate))}"
                f"{md_cell(truncation_mark(e))}"
            )
    return out or ["- none recorded (no records in this run directory, or no score changed)"]


def render_markdown(inp: ReportInputs, figure_files: dict[str, str] | None = None) -> str:
    """report.md; `figure_files` maps a figure name (forest, flips, kv) to its path relative to report.md."""
    v, c = inp.verdict, inp.comparison
    figure_files = figure_files or {}
    lines = [
        f"# {STATUS_MARK[v.status]}",
        "",
        f"**{md_cell(v.summary)}**",
        "",
        (
            f"candidate `{md_cell(c.candidate)}` vs baseline `{md_cell(c.baseline)}`; policy "
            f"{md_cell(v.policy.name)} ({v.policy_sha256[:12]}); verdict source: {md_cell(inp.verdict_source)}"
        ),
        "",
        "## Verdict per task",
        "",
    ]
    for t in v.tasks:
        lines.append(f"- {STATUS_MARK[t.status]} **{md_cell(t.task)}** ({md_cell(t.metric)}): {md_cell(t.reason)}")
        lines += [f"  - warning: {md_cell(w)}" for w in t.warnings]
    for note in floor_notes(inp):
        lines += ["", f"> **Accuracy carries no information here.** {md_cell(note)}"]
    for note in engine_notes(inp):
        lines += ["", f"> **Not deterministic.** {md_cell(note)}"]
    for note in truncation_notes(inp):
        lines += ["", f"> **Truncated outputs.** {md_cell(note)}"]
    cells = [rows.table_row(t, gated_estimate(c, t), c.generation_for(t.task)) for t in v.tasks]
    lines += ["", "## Results", ""] + md_table(rows.results_headers(v), [[_cell(x) for x in r] for r in cells], raw=True)
    fam = rows.family_false_alarm(v)
    if fam is not None:
        lines += [
            "",
            f"Chance that at least one task fails the k-SE rule for an identical candidate: {percent(fam)}.",
        ]
    gen = rows.generation_rows(c, v)
    if gen:
        lines += ["", "## Truncation and output length", ""]
        lines += md_table(rows.GEN_HEADERS, [[_cell(x) for x in r] for r in gen], raw=True)
    lines += sequential_section(inp)
    for key, title in FIGURE_TITLES.items():
        if key in figure_files:
            lines += ["", f"## {title}", "", f"![{title}]({figure_files[key]})"]
    lines += _kv_section(inp, figure_files.get("kv"))
    lines += kv_provenance_section(inp)
    if c.distribution:
        lines += ["", "## Distribution statistics (teacher-forced)", ""] + md_table(
            rows.DIST_HEADERS, [rows.dist_row(d) for d in c.distribution]
        )
    lines += reference_section(inp)
    lines += batch_invariance_section(inp)
    lines += cache_path_section(inp)
    lines += slices_section(inp)
    lines += ["", "## Changed answers", ""] + _examples(inp)
    lines += ["", "## Methods and conventions", ""] + [f"- {md_cell(m)}" for m in methods(inp)]
    lines += ["", "## Provenance", ""] + [f"- {md_cell(k)}: {md_cell(val)}" for k, val in provenance(inp)]
    return "\n".join(lines) + "\n"
