"""One run's report as a `Document`, built once from ReportInputs and its Figures: the verdict banner, the
verdict per task with its call-outs, the results table, truncation, sequential looks, the figures, the
KV-cache sections, distribution statistics, the reference-answer, batch-invariance, cache-path and slice
sections, changed answers, methods and provenance."""

from __future__ import annotations

from dataclasses import replace

from qa.report import batch_invariance, cache_path, provenance, reference, rows, sequential, slices
from qa.report.document import (
    Banner,
    Block,
    Bullets,
    Callout,
    Code,
    Document,
    Item,
    Line,
    Paragraph,
    Preformatted,
    Section,
    StatusMark,
    Strong,
    Verbatim,
    bullets,
    line,
    table,
)
from qa.report.examples import Example, record_ids, redacted, truncation_mark
from qa.report.figures import KV_TITLE, Figures
from qa.report.gather import ReportInputs, gated_estimate
from qa.report.notes import clip, engine_notes, floor_notes, methods, spec_redacted, truncation_notes
from qa.report.notes import provenance as provenance_lines
from qa.textfmt import percent

NO_EXAMPLES = "none recorded (no records in this run directory, or no score changed)"


def banner(inp: ReportInputs) -> Banner:
    """The verdict, its summary, and what was compared under which policy."""
    v, c = inp.verdict, inp.comparison
    return Banner(v.status, v.summary, line(
        "candidate ", Code(c.candidate), " vs baseline ", Code(c.baseline), "; policy ", v.policy.name,
        f" ({v.policy_sha256[:12]}); verdict source: ", inp.verdict_source))


def verdict_section(inp: ReportInputs) -> Section:
    """One line per task with its warnings, then the call-outs: no information, not deterministic, truncated."""
    items = tuple(
        Item(line(StatusMark(t.status), " ", Strong(t.task), " (", t.metric, "): ", t.reason),
             tuple(line("warning: ", w) for w in t.warnings))
        for t in inp.verdict.tasks)
    notes = [Callout("Accuracy carries no information here.", n) for n in floor_notes(inp)]
    notes += [Callout("Not deterministic.", n) for n in engine_notes(inp)]
    notes += [Callout("Truncated outputs.", n) for n in truncation_notes(inp)]
    return Section("Verdict per task", (Bullets(items), *notes))


def results_section(inp: ReportInputs) -> Section:
    """One row per task (HEADERS) and the chance that an identical candidate fails the k-SE rule somewhere."""
    v, c = inp.verdict, inp.comparison
    body = []
    for t in v.tasks:
        cells = rows.table_row(t, gated_estimate(c, t), c.generation_for(t.task))
        cells[0] = replace(cells[0], strong=True)
        cells[1] = replace(cells[1], status=t.status)
        body.append(cells)
    blocks: list[Block] = [table(rows.results_headers(v), body, rows.NUM_COLS)]
    fam = rows.family_false_alarm(v)
    if fam is not None:
        blocks.append(Paragraph(line(
            "Chance that at least one task fails the k-SE rule for an identical candidate: ", percent(fam), ".")))
    return Section("Results", tuple(blocks))


def truncation_section(inp: ReportInputs) -> Section | None:
    """Per generative task: each arm's truncation, the change and its rule, output tokens (None: no such task)."""
    gen = rows.generation_rows(inp.comparison, inp.verdict)
    if not gen:
        return None
    return Section("Truncation and output length",
                   (table(rows.GEN_HEADERS, gen, frozenset(range(1, len(rows.GEN_HEADERS)))),))


def kv_section(inp: ReportInputs, figs: Figures) -> Section | None:
    """kv_inspect.json's summary per format and its per-layer figure (None when the run has none)."""
    if inp.kv is None and inp.kv_problem is None:
        return None
    if inp.kv is None:
        return Section(KV_TITLE, (Paragraph(line("kv_inspect.json could not be shown: ", inp.kv_problem or "")),))
    memory = rows.kv_memory(inp.kv)
    blocks: list[Block] = [Paragraph(line(rows.kv_caption(inp.kv))),
                           *((Paragraph(line(memory)),) if memory is not None else ()),
                           table(rows.KV_HEADERS, rows.kv_rows(inp.kv), frozenset(range(2, len(rows.KV_HEADERS))))]
    return Section(KV_TITLE, tuple(blocks) + ((figs.kv,) if figs.kv is not None else ()))


def distribution_section(inp: ReportInputs, figs: Figures) -> Section | None:
    """The teacher-forced distribution statistics and each task's KL histogram (None without them)."""
    if not inp.comparison.distribution:
        return None
    dist = [rows.dist_row(d) for d in inp.comparison.distribution]
    return Section("Distribution statistics (teacher-forced)",
                   (table(rows.DIST_HEADERS, dist, frozenset(range(2, 10))), *figs.kl))


def example_item(task: str, e: Example) -> Item:
    """One changed answer: the extracted answers on the line, each arm's completion below it when recorded."""
    text = line(task, " ", f"{e.item_id}#{e.repeat} {e.direction}: target ", clip(e.target), "; baseline ",
                clip(e.extracted_baseline), "; candidate ", clip(e.extracted_candidate), truncation_mark(e))
    completions = tuple(line(f"{arm} completion: ", Verbatim(clip(c)))
                        for arm, c in (("baseline", e.completion_baseline), ("candidate", e.completion_candidate))
                        if c is not None)
    return Item(text, completions)


def examples_section(inp: ReportInputs) -> Section:
    """Changed answers per task; a redacted task's by record id only."""
    items: list[Item] = []
    for task, exs in inp.examples.items():
        if exs and redacted(task):
            items.append(Item(line(task, " (record ids only): ", record_ids(exs))))
            continue
        items += [example_item(task, e) for e in exs]
    return Section("Changed answers", (Bullets(tuple(items)) if items else bullets([NO_EXAMPLES]),))


def provenance_section(inp: ReportInputs) -> Section:
    """Where every number came from, and spec.toml with its secrets redacted."""
    lines: list[Line] = [line(k, ": ", v) for k, v in provenance_lines(inp)]
    spec = () if inp.spec_text is None else (Section("spec.toml", (Preformatted(spec_redacted(inp.spec_text)),)),)
    return Section("Provenance", (bullets(lines), *spec))


def build_document(inp: ReportInputs, figs: Figures) -> Document:
    """The whole report of one run directory, once, for both renderers."""
    v, c = inp.verdict, inp.comparison
    drawn = [Section(f.title, (f,)) for f in (figs.forest, figs.flips) if f is not None]
    sections = [
        verdict_section(inp),
        results_section(inp),
        truncation_section(inp),
        sequential.section(inp),
        *drawn,
        kv_section(inp, figs),
        provenance.section(inp),
        distribution_section(inp, figs),
        reference.section(inp),
        batch_invariance.section(inp),
        cache_path.section(inp),
        slices.section(inp),
        examples_section(inp),
        Section("Methods and conventions", (bullets(methods(inp)),)),
        provenance_section(inp),
    ]
    return Document(f"{v.status.upper()}: {c.candidate} vs {c.baseline}", banner(inp),
                    tuple(s for s in sections if s is not None))
