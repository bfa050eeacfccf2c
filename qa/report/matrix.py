"""The run-level report of a several-candidate run: report.md and report.html at the run root with the
run's verdict, a candidate x task matrix (status per cell, each candidate linked to its own report in
candidates/<name>/), the delta per cell and one line per candidate with its reasons; built once as a
`Document` and rendered by the same renderers as the per-candidate reports."""

from __future__ import annotations

from pathlib import Path

from evals.errors import RecordError
from qa.files.rundir import RunDir
from qa.files.verdict import RunVerdict, Verdict
from qa.gate.provenance import load_kv_provenance
from qa.gate.summary import STATUS_MARK, matrix_tasks
from qa.report.document import (
    Banner,
    Bullets,
    Cell,
    Code,
    Document,
    Item,
    Link,
    Section,
    StatusMark,
    Strong,
    Table,
    line,
    table,
)
from qa.report.html import render_html
from qa.report.markdown import render_markdown
from qa.textfmt import pts
from quant.errors import QuantError
from quant.fileio import atomic_write_text
from quant.kv.inspect_report import load_inspect


def _delta(verdict: Verdict | None, task: str) -> str:
    tv = next((t for t in verdict.tasks if t.task == task), None) if verdict is not None else None
    return "" if tv is None or tv.delta is None else pts(tv.delta)


def kv_memory(run_dir: Path, run: RunVerdict) -> dict[str, tuple[int, int]]:
    """candidate -> (KV bytes per token, the 16-bit cache's) from its kv_inspect.json, else from the KV provenance
    its arm.json recorded (the qa_kv plugin's per-layer geometry); candidates with neither are left out."""
    rd, out = RunDir(run_dir), {}
    for c in run.candidates:
        path = rd.candidate(c.name).kv_inspect
        sizes = None
        try:
            if path.is_file():
                sizes = load_inspect(path).bytes_per_token()
            if sizes is None and (kv := load_kv_provenance(rd.arm_records(c.name))) is not None:
                sizes = kv.bytes_per_token()
        except (QuantError, RecordError):
            continue
        if sizes is not None:
            out[c.name] = sizes
    return out


def _bytes(sizes: tuple[int, int] | None) -> str:
    return "-" if sizes is None else f"{sizes[0]} ({100 * sizes[0] / sizes[1]:.0f}%)"


def status_table(run: RunVerdict, memory: dict[str, tuple[int, int]] | None = None) -> Table:
    """Candidate x task: each candidate (linked to its report.md), its status per task ('-': not run) and, when
    `memory` has any, its KV bytes per token (% of the 16-bit cache's)."""
    tasks = matrix_tasks(run)
    mem = memory or {}
    body = [[Cell(c.name, link=f"{c.folder}/report.md"), Cell(STATUS_MARK[c.status], status=c.status)]
            + ([Cell(_bytes(mem.get(c.name)))] if mem else [])
            + [Cell(STATUS_MARK[c.tasks[t]], status=c.tasks[t]) if t in c.tasks else Cell("-") for t in tasks]
            for c in run.candidates]
    return table(["candidate", "verdict", *(["KV bytes/token"] if mem else []), *tasks], body)


def delta_table(run: RunVerdict, verdicts: dict[str, Verdict]) -> Table:
    """Candidate x task: delta = candidate - baseline in points ('-': not run or undefined)."""
    tasks = matrix_tasks(run)
    body = [[c.name] + [_delta(verdicts.get(c.name), t) or "-" for t in tasks] for c in run.candidates]
    return table(["candidate", *tasks], body, frozenset(range(1, len(tasks) + 1)))


def matrix_document(run: RunVerdict, verdicts: dict[str, Verdict],
                    memory: dict[str, tuple[int, int]] | None = None) -> Document:
    """The run-level report of a several-candidate run, once, for both renderers (`memory`: kv_memory's)."""
    intro = line("Each candidate is compared with baseline ", Code(run.baseline),
                 " on the same items and gated on its own; policy ", run.policy_name,
                 f" ({run.policy_sha256[:12]}).")
    candidates = tuple(
        Item(line(StatusMark(c.status), " ", Strong(c.name), ": ", c.summary, " (",
                  Link("report.md", f"{c.folder}/report.md"), ", ", Link("report.html", f"{c.folder}/report.html"),
                  ")"),
             tuple(line(t, ": ", r) for t, r in c.reasons.items()))
        for c in run.candidates)
    return Document(
        f"{run.status.upper()}: {len(run.candidates)} candidates",
        Banner(run.status, run.summary, intro),
        (Section("Candidate x task", (status_table(run, memory),)),
         Section("Delta (candidate - baseline, points)", (delta_table(run, verdicts),)),
         Section("Candidates", (Bullets(candidates),))),
    )


def render_matrix(run_dir: Path, run: RunVerdict, verdicts: dict[str, Verdict]) -> tuple[Path, Path]:
    """Write report.md and report.html of a several-candidate run at its root; their paths."""
    rd = RunDir(run_dir)
    doc = matrix_document(run, verdicts, kv_memory(run_dir, run))
    atomic_write_text(rd.report_md, render_markdown(doc, {}))
    atomic_write_text(rd.report_html, render_html(doc))
    return rd.report_md, rd.report_html
