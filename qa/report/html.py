"""report.html: one self-contained page (figures as data URIs, inline CSS) whose Content-Security-Policy
allows no script at all; every datum that came from a model, a dataset or a file is HTML-escaped."""

from __future__ import annotations

import base64
import html

from qa.report.batch_invariance import html_section as batch_invariance_section
from qa.report.examples import record_ids, redacted, truncation_mark
from qa.report.figures import Figures
from qa.report.gather import ReportInputs, gated_estimate
from qa.report.notes import (
    clip,
    engine_notes,
    floor_notes,
    methods,
    provenance,
    spec_redacted,
    truncation_notes,
)
from qa.report.provenance import html_section as kv_provenance_section
from qa.report.reference import html_section as reference_section
from qa.report.rows import (
    DIST_HEADERS,
    GEN_HEADERS,
    KIND_LABELS,
    KV_HEADERS,
    NUM_COLS,
    Cell,
    dist_row,
    family_false_alarm,
    generation_rows,
    kv_caption,
    kv_rows,
    results_headers,
    table_row,
)
from qa.report.sequential import html_section as sequential_section
from qa.report.serving import html_section as cache_path_section
from qa.report.slices import html_section as slices_section
from qa.textfmt import percent

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1f2328;background:#fff}
main{max-width:1320px;margin:0 auto;padding:0 24px 48px}
.banner{padding:28px 24px;color:#fff;margin-bottom:20px}
.banner h1{font-size:64px;line-height:1;margin:0 0 10px;letter-spacing:2px}
.banner p{font-size:20px;margin:4px 0}.banner .sub{font-size:14px;opacity:.9}
.pass{background:#1a7f37}.fail{background:#cf222e}.inconclusive{background:#9a6700}
.pill{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;font-weight:600;font-size:12px}
h2{border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;font-size:12.5px;width:100%}
th,td{border:1px solid #d0d7de;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f6f8fa}small{color:#57606a}.scroll{overflow-x:auto}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.callout{border-left:6px solid #9a6700;background:#fff8c5;padding:10px 14px;margin:12px 0}
.warn{color:#9a6700}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;white-space:pre-wrap;word-break:break-word;font-size:12px}
img{max-width:100%}
ul.tasks li{margin:4px 0}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _pill(status: str) -> str:
    return f'<span class="pill {_e(status)}">{_e(status.upper())}</span>'


def _cell(cell: Cell) -> str:
    return _e(cell.main) + (f"<br><small>{_e(cell.sub)}</small>" if cell.sub else "")


def html_table(headers: tuple[str, ...] | list[str], rows: list[list[str]], num_cols: set[int] | frozenset[int]) -> str:
    """A table of already-escaped cells; the `num_cols` columns right-aligned."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for r in rows:
        cells = "".join(
            f'<td class="num">{c}</td>' if i in num_cols else f"<td>{c}</td>" for i, c in enumerate(r)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _results(inp: ReportInputs) -> list[str]:
    v = inp.verdict
    rows = []
    for t in v.tasks:
        cells = [_cell(x) for x in table_row(t, gated_estimate(inp.comparison, t), inp.comparison.generation_for(t.task))]
        cells[0] = f"<b>{_e(t.task)}</b><br><small>{_e(t.metric)}</small>"
        cells[1] = _pill(t.status) + (
            f"<br><small>{_e(KIND_LABELS[t.kind])}</small>" if t.kind != "decided" else ""
        )
        rows.append(cells)
    out = ["<h2>Results</h2>", '<div class="scroll">', html_table(results_headers(v), rows, NUM_COLS), "</div>"]
    fam = family_false_alarm(v)
    if fam is not None:
        out.append(
            f"<p>Chance that at least one task fails the k-SE rule although the candidate is identical: "
            f"<b>{_e(percent(fam))}</b>.</p>"
        )
    gen = [[_cell(x) for x in r] for r in generation_rows(inp.comparison, v)]
    if gen:
        out += ["<h2>Truncation and output length</h2>", html_table(GEN_HEADERS, gen, set(range(1, len(GEN_HEADERS))))]
    return out


def _kv_section(inp: ReportInputs, figs: Figures) -> list[str]:
    if inp.kv is None and inp.kv_problem is None:
        return []
    out = ["<h2>Per-layer KV-cache error</h2>"]
    if inp.kv is None:
        return out + [f"<p>kv_inspect.json could not be shown: {_e(inp.kv_problem)}</p>"]
    rows = [[_e(x) for x in r] for r in kv_rows(inp.kv)]
    out += [f"<p>{_e(kv_caption(inp.kv))}</p>", html_table(KV_HEADERS, rows, set(range(2, len(KV_HEADERS))))]
    if figs.kv:
        out.append(_img(figs.kv, "per-layer SQNR of K and V and attention error"))
    return out


def _examples(inp: ReportInputs) -> str:
    out = []
    for task, exs in inp.examples.items():
        if not exs:
            continue
        if redacted(task):
            out.append(f"<p><b>{_e(task)}</b> (record ids only): {_e(record_ids(exs))}</p>")
            continue
        generative = any(e.completion_baseline is not None or e.completion_candidate is not None for e in exs)
        headers = ["item", "direction", "target", "baseline answer", "candidate answer"]
        rows = []
        for e in exs:
            row = [
                _e(f"{e.item_id}#{e.repeat}"),
                _e(e.direction + truncation_mark(e)),
                _e(clip(e.target)),
                _e(clip(e.extracted_baseline)),
                _e(clip(e.extracted_candidate)),
            ]
            if generative:
                row += [
                    f"<pre>{_e(clip(e.completion_baseline))}</pre>",
                    f"<pre>{_e(clip(e.completion_candidate))}</pre>",
                ]
            rows.append(row)
        if generative:
            headers += ["baseline completion", "candidate completion"]
        out.append(f"<h3>{_e(task)}</h3>")
        out.append(html_table(headers, rows, set()))
    return "".join(out) or "<p>None recorded (no records in this run directory, or no score changed).</p>"


def render_html(inp: ReportInputs, figs: Figures) -> str:
    """report.html: one self-contained page, figures as data URIs, no script, every datum escaped."""
    v, c = inp.verdict, inp.comparison
    parts = [
        f'<header class="banner {_e(v.status)}" id="verdict"><h1>{_e(v.status.upper())}</h1>',
        f"<p>{_e(v.summary)}</p>",
        (
            f'<p class="sub">candidate <b>{_e(c.candidate)}</b> vs baseline <b>{_e(c.baseline)}</b> &middot; '
            f"policy {_e(v.policy.name)} ({_e(v.policy_sha256[:12])}) &middot; {_e(inp.verdict_source)}</p></header><main>"
        ),
        '<h2>Verdict per task</h2><ul class="tasks">',
    ]
    for t in v.tasks:
        parts.append(f"<li>{_pill(t.status)} <b>{_e(t.task)}</b> ({_e(t.metric)}): {_e(t.reason)}")
        parts += [f'<br><span class="warn">warning: {_e(w)}</span>' for w in t.warnings]
        parts.append("</li>")
    parts.append("</ul>")
    for note in floor_notes(inp):
        parts.append(f'<div class="callout"><b>Accuracy carries no information here.</b> {_e(note)}</div>')
    for note in engine_notes(inp):
        parts.append(f'<div class="callout"><b>Not deterministic.</b> {_e(note)}</div>')
    for note in truncation_notes(inp):
        parts.append(f'<div class="callout"><b>Truncated outputs.</b> {_e(note)}</div>')
    parts += _results(inp)
    parts.append(sequential_section(inp))
    if figs.forest:
        alt = "forest plot of delta with the gate's and 95% CIs"
        parts += ["<h2>Forest plot of delta</h2>", _img(figs.forest, alt)]
    if figs.flips:
        parts += ["<h2>Flips</h2>", _img(figs.flips, "regressions and improvements per task")]
    parts += _kv_section(inp, figs)
    parts.append(kv_provenance_section(inp))
    if c.distribution or figs.kl:
        parts.append("<h2>Distribution statistics (teacher-forced)</h2>")
        if c.distribution:
            rows = [[_e(x) for x in dist_row(d)] for d in c.distribution]
            parts.append(html_table(DIST_HEADERS, rows, set(range(2, 10))))
        parts += [_img(png, f"KL divergence per chunk, {task}") for task, png in figs.kl]
    parts.append(reference_section(inp))
    parts.append(batch_invariance_section(inp))
    parts.append(cache_path_section(inp))
    parts.append(slices_section(inp))
    parts += ["<h2>Changed answers</h2>", _examples(inp)]
    parts += ["<h2>Methods and conventions</h2><ul>"] + [f"<li>{_e(m)}</li>" for m in methods(inp)] + ["</ul>"]
    parts += [
        "<h2>Provenance</h2>",
        html_table(["item", "value"], [[_e(k), _e(val)] for k, val in provenance(inp)], set()),
    ]
    if inp.spec_text is not None:
        parts += ["<h3>spec.toml</h3>", f"<pre>{_e(spec_redacted(inp.spec_text))}</pre>"]
    parts.append("</main>")
    title = f"{v.status.upper()}: {c.candidate} vs {c.baseline}"
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>\n"
    )
