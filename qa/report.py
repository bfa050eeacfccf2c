"""Render a run directory into report.md and a self-contained report.html (plots inline).

The report is written for a ten-second read: the verdict first, big and coloured, then one row
per task, the forest plot, flips, answer agreement and distribution statistics, examples of
changed answers, methods and provenance. Everything that came from a model, a dataset or a data
file is HTML-escaped (and the page carries a Content-Security-Policy that allows no script at
all); GPQA items are shown by record id only.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from evals.errors import RecordError
from evals.records import SampleRecord, read_records
from qa import plots
from qa.comparison import Comparison, DistributionEstimate, Estimate, Interval, load_comparison
from qa.errors import QAError
from qa.gate import RuleResult, TaskVerdict, Verdict, evaluate, load_verdict, md_cell, percent, pts
from qa.policy import Policy, default_policy
from quant.fileio import atomic_write_bytes, atomic_write_text, sha256_file

REDACTED_TASK_PREFIXES = ("gpqa",)  # gated dataset: items are shown by record id only, never text
MAX_EXAMPLES = 5  # changed answers shown per task and direction
MAX_COMPLETION_CHARS = 600
SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password|authorization)", re.IGNORECASE)
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


@dataclass(frozen=True)
class Example:
    """One item whose gated score differs between the arms (text fields are raw, escape on output)."""

    item_id: str
    repeat: int
    direction: str  # "regression" (baseline scored higher), "improvement", or "answer changed" (same score)
    target: str | None
    extracted_baseline: str | None
    extracted_candidate: str | None
    completion_baseline: str | None
    completion_candidate: str | None


@dataclass(frozen=True)
class KVLayers:
    """Per-layer quantization SQNR in dB of the K and V caches (from kv_inspect.json)."""

    layers: list[str]
    k_sqnr_db: list[float | None]
    v_sqnr_db: list[float | None]


@dataclass(frozen=True)
class ReportInputs:
    """Everything a report shows, gathered from one run directory."""

    run_dir: Path
    comparison: Comparison
    verdict: Verdict
    verdict_source: str
    spec_text: str | None = None
    env: dict[str, object] | None = None
    kv: KVLayers | None = None
    examples: dict[str, list[Example]] = field(default_factory=dict)


def redacted(task: str) -> bool:
    """True for tasks whose items may only be named by record id (GPQA)."""
    return task.lower().startswith(REDACTED_TASK_PREFIXES)


# ----------------------------------------------------------------------------- gathering


def resolve_verdict(run_dir: Path, comparison: Comparison, policy: Policy | None) -> tuple[Verdict, str]:
    """The verdict to show: re-gated under `policy` if given, else verdict.json when it belongs to
    this comparison.json, else the shipped default policy; the string says which."""
    sha = sha256_file(run_dir / "comparison.json")
    if policy is not None:
        return evaluate(comparison, policy, sha), f"evaluated for this report under policy '{policy.name}'"
    vpath = run_dir / "verdict.json"
    if vpath.is_file():
        verdict = load_verdict(vpath)
        if verdict.comparison_sha256 == sha:
            return verdict, "verdict.json"
        return (
            evaluate(comparison, verdict.policy, sha),
            "re-evaluated: verdict.json was made from another comparison.json; same policy",
        )
    return evaluate(
        comparison, default_policy(), sha
    ), "no verdict.json: evaluated under the shipped default policy"


def read_kv_inspect(path: Path) -> KVLayers | None:
    """Per-layer K/V SQNR from kv_inspect.json, read defensively: None when absent or unrecognised.

    Accepted shapes: {"layers": [{"layer": 0, "k_sqnr_db": .., "v_sqnr_db": ..}, ...]} (also
    "per_layer"; keys containing k/v and sqnr), or {"k_sqnr_db": [...], "v_sqnr_db": [...]}.
    """
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None

    def num(v: object) -> float | None:
        return (
            float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None
        )

    def pick(d: dict[str, object], which: str) -> object:
        for key, v in d.items():
            k = key.lower()
            if "sqnr" in k and re.search(rf"(^|[_\-.]){which}($|[_\-.])", k):
                return v
        return None

    rows = data.get("layers", data.get("per_layer"))
    if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
        names = [str(r.get("layer", r.get("index", i))) for i, r in enumerate(rows)]
        ks = [num(pick(r, "k")) for r in rows]
        vs = [num(pick(r, "v")) for r in rows]
    else:
        kl, vl = pick(data, "k"), pick(data, "v")
        if not (isinstance(kl, list) and isinstance(vl, list) and len(kl) == len(vl) and kl):
            return None
        names = [str(i) for i in range(len(kl))]
        ks, vs = [num(v) for v in kl], [num(v) for v in vl]
    if all(v is None for v in ks + vs):
        return None
    return KVLayers(layers=names, k_sqnr_db=ks, v_sqnr_db=vs)


def _predicted(r: SampleRecord, filter_name: str) -> str | None:
    if filter_name in r.extracted:
        return r.extracted[filter_name]
    if r.choice_loglikelihoods:
        best = max(range(len(r.choice_loglikelihoods)), key=r.choice_loglikelihoods.__getitem__)
        return f"choice {best}"
    return None


def find_examples(run_dir: Path, comparison: Comparison, est: Estimate) -> list[Example]:
    """Items whose gated score differs between arms, from records/<arm>/<task>.jsonl (if present)."""
    paths = [
        run_dir / "records" / arm / f"{est.task}.jsonl" for arm in (comparison.baseline, comparison.candidate)
    ]
    if not all(p.is_file() for p in paths):
        return []
    try:
        base, cand = (read_records(p) for p in paths)
    except RecordError:
        return []
    key = f"{est.metric},{est.filter}"
    cand_by = {r.key: r for r in cand}
    hide = redacted(est.task)
    out: dict[str, list[Example]] = {"regression": [], "improvement": [], "answer changed": []}
    for rb in base:
        rc = cand_by.get(rb.key)
        sb, sc = rb.scores.get(key), (rc.scores.get(key) if rc else None)
        if rc is None or sb is None or sc is None:
            continue
        if sb != sc:
            direction = "regression" if sb > sc else "improvement"
        elif rb.completion is not None and _predicted(rb, est.filter) != _predicted(rc, est.filter):
            direction = "answer changed"  # same score, different answer: the signal when accuracy is stuck
        else:
            continue
        if len(out[direction]) >= MAX_EXAMPLES:
            continue
        out[direction].append(
            Example(
                item_id=rb.item_id,
                repeat=rb.repeat,
                direction=direction,
                target=None if hide else rb.target,
                extracted_baseline=None if hide else _predicted(rb, est.filter),
                extracted_candidate=None if hide else _predicted(rc, est.filter),
                completion_baseline=None if hide else rb.completion,
                completion_candidate=None if hide else rc.completion,
            )
        )
    return out["regression"] + out["improvement"] + out["answer changed"]


def gated_estimate(comparison: Comparison, tv: TaskVerdict) -> Estimate | None:
    """The estimate a task verdict was decided on."""
    for e in comparison.estimates:
        if e.task == tv.task and f"{e.metric},{e.filter}" == tv.metric:
            return e
    return None


def gather(run_dir: Path, policy: Policy | None = None) -> ReportInputs:
    """Read everything the report shows from `run_dir` (comparison.json is required)."""
    if not run_dir.is_dir():
        raise QAError(f"{run_dir}: no such run directory")
    comparison = load_comparison(run_dir / "comparison.json")
    verdict, source = resolve_verdict(run_dir, comparison, policy)
    spec = run_dir / "spec.toml"
    env: dict[str, object] | None = None
    if (run_dir / "env.json").is_file():
        try:
            loaded = json.loads((run_dir / "env.json").read_text(encoding="utf-8"))
            env = loaded if isinstance(loaded, dict) else {"env.json": loaded}
        except (json.JSONDecodeError, UnicodeDecodeError):
            env = {"env.json": "unreadable"}
    examples = {}
    for tv in verdict.tasks:
        est = gated_estimate(comparison, tv)
        if est is not None:
            examples[tv.task] = find_examples(run_dir, comparison, est)
    return ReportInputs(
        run_dir=run_dir,
        comparison=comparison,
        verdict=verdict,
        verdict_source=source,
        spec_text=spec.read_text(encoding="utf-8", errors="replace") if spec.is_file() else None,
        env=env,
        kv=read_kv_inspect(run_dir / "kv_inspect.json"),
        examples=examples,
    )


# ----------------------------------------------------------------------------- shared rows


def _rule(tv: TaskVerdict, name: str) -> RuleResult | None:
    return next((r for r in tv.rules if r.rule == name), None)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ci(ci: Interval | None) -> str:
    return "-" if ci is None else f"[{100 * ci.lower:+.1f}, {100 * ci.upper:+.1f}]"


def _p(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


@dataclass(frozen=True)
class Cell:
    """One table cell as plain (unescaped) text: a main value and an optional smaller second line."""

    main: str
    sub: str = ""


HEADERS = (
    "task",
    "verdict",
    "n",
    "baseline → candidate",
    "delta ± SE (paired)",
    "90% / 95% CI (pts)",
    "non-inferiority",
    "k-SE rule",
    "flips down / up",
    "McNemar p",
    "MDE",
    "answer agreement",
)
NUM_COLS = frozenset({2, 3, 4, 5, 10})
KIND_LABELS = {
    "decided": "",
    "errors": "too many errors",
    "no_information": "no information",
    "underpowered": "underpowered",
    "undefined": "undefined",
    "missing": "missing",
}
_NOT_DECIDED = {
    "no_information": "no information",
    "errors": "too many errors",
    "missing": "missing",
    "undefined": "undefined",
}


def _k_label(verdict: Verdict) -> str:
    ks = {r.k for t in verdict.tasks for r in t.rules if r.rule == "sigma" and r.k is not None}
    return f"{ks.pop():g}-SE rule" if len(ks) == 1 else "k-SE rule"


def table_row(tv: TaskVerdict, est: Estimate | None) -> list[Cell]:
    """The cells of one task's row (HEADERS order)."""
    head = [Cell(tv.task, tv.metric), Cell(tv.status.upper(), KIND_LABELS[tv.kind])]
    if est is None:
        return head + [Cell("-")] * (len(HEADERS) - 2)
    sig, ni = _rule(tv, "sigma"), _rule(tv, "noninferiority")
    skipped = _NOT_DECIDED.get(tv.kind)
    if skipped:
        ni_cell = sig_cell = Cell("n/a", skipped)
    else:
        ni_cell = Cell("-") if ni is None else Cell(ni.status, f"margin {100 * (ni.margin or 0):.1f} pts")
        sig_cell = Cell("-")
        if sig is not None:
            thr = "-" if sig.threshold is None else f"{100 * sig.threshold:.1f}"
            rel = "≤" if sig.status == "pass" else ">"
            sig_cell = Cell(
                sig.status,
                f"|d| {rel} {thr} pts ({sig.basis} SE); false alarm {percent(sig.false_alarm_rate)}",
            )
    flips = Cell("-")
    if est.flips is not None:
        f = est.flips
        flips = Cell(
            f"{f.n10} / {f.n01}", f"{100 * f.rate:.1f}% [{100 * f.ci95.lower:.1f}, {100 * f.ci95.upper:.1f}]"
        )
    mc = (
        Cell("-") if est.mcnemar is None else Cell(_p(est.mcnemar.p_exact), f"mid-p {_p(est.mcnemar.p_midp)}")
    )
    mde = Cell("-")
    if tv.mde is not None and not skipped:
        mde = Cell(
            f"{100 * tv.mde:.1f} pts", f"need n ≥ {tv.n_needed}" if tv.n_needed and tv.n_needed > tv.n else ""
        )
    agree = Cell("-")
    if est.agreement is not None:
        shares = [est.agreement.extracted, est.agreement.completion]
        main = " / ".join("-" if s is None else f"{100 * s.share:.1f}%" for s in shares)
        agree = Cell(main, "answers / completions identical")
    se = "-" if est.se_paired is None else f"{100 * est.se_paired:.1f}"
    n = Cell(f"{est.n}", f"x{est.repeats} repeats" if est.repeats > 1 else "")
    means = Cell(f"{_pct(est.mean_baseline)} → {_pct(est.mean_candidate)}")
    return head + [
        n,
        means,
        Cell(f"{pts(est.delta)} ± {se}"),
        Cell(_ci(est.ci90), _ci(est.ci95)),
        ni_cell,
        sig_cell,
        flips,
        mc,
        mde,
        agree,
    ]


def family_false_alarm(verdict: Verdict) -> float | None:
    """P(at least one task fails the k-SE rule) for identical candidates: 1 - prod(1 - FA_task)."""
    rates = [
        r.false_alarm_rate
        for t in verdict.tasks
        for r in t.rules
        if r.rule == "sigma" and r.false_alarm_rate is not None
    ]
    if not rates:
        return None
    return 1 - math.prod(1 - r for r in rates)


def floor_notes(inp: ReportInputs) -> list[str]:
    """Plain-text call-outs for tasks where accuracy carries no information (floor or ceiling)."""
    notes = []
    kld = next((d for d in inp.comparison.distribution if d.metric == "kld"), None)
    for tv in inp.verdict.tasks:
        if tv.kind != "no_information":
            continue
        est = gated_estimate(inp.comparison, tv)
        text = f"{tv.task}: {tv.reason}."
        if est is not None and est.agreement is not None:
            for label, s in (
                ("extracted answers", est.agreement.extracted),
                ("completions", est.agreement.completion),
            ):
                if s is not None:
                    text += (
                        f" Identical {label} in both arms: {s.agree}/{s.n} = {100 * s.share:.1f}% "
                        f"(95% Wilson [{100 * s.ci95.lower:.1f}, {100 * s.ci95.upper:.1f}])."
                    )
        else:
            text += " No answer agreement was recorded for it."
        if kld is not None:
            text += f" KL divergence ({kld.task}): {kld.value:.4g} nats/token."
        notes.append(text)
    return notes


def engine_notes(run_dir: Path) -> list[str]:
    """One line per arm whose engine says it is not bit-reproducible (from records/<arm>/arm.json)."""
    notes = []
    for path in sorted(run_dir.glob("records/*/arm.json")):
        try:
            info = json.loads(path.read_text(encoding="utf-8")).get("engine_info") or {}
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, OSError):
            continue
        if isinstance(info, dict) and info.get("deterministic") is False:
            notes.append(f"arm {path.parent.name}: engine {info.get('name')!r} is not deterministic, so a rerun of "
                         "the same arm can flip answers by itself; add an [arms.rerun] to measure that noise floor.")
    return notes


def _flat_env(env: dict[str, object], prefix: str = "", depth: int = 0) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for k, v in env.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and depth < 2:
            out += _flat_env(v, key + ".", depth + 1)
            continue
        text = "[redacted]" if SECRET_KEY.search(str(k)) else json.dumps(v) if not isinstance(v, str) else v
        out.append((key, text if len(text) <= 200 else text[:200] + " ..."))
    return out


def _spec_redacted(spec: str) -> str:
    lines = []
    for line in spec.splitlines():
        key = line.split("=", 1)[0]
        lines.append(f'{key}= "[redacted]"' if "=" in line and SECRET_KEY.search(key) else line)
    return "\n".join(lines)


def _clip(text: str | None) -> str:
    if text is None:
        return "-"
    return text if len(text) <= MAX_COMPLETION_CHARS else text[:MAX_COMPLETION_CHARS] + " ... [truncated]"


# ----------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class Figures:
    """PNG bytes of every figure the report has data for."""

    forest: bytes | None
    flips: bytes | None
    kl: list[tuple[str, bytes]]
    kv: bytes | None


def make_figures(inp: ReportInputs) -> Figures:
    """Draw the figures; a figure without data is None (or an empty list)."""
    forest_rows, flip_rows = [], []
    for tv in inp.verdict.tasks:
        est = gated_estimate(inp.comparison, tv)
        if est is None or est.delta is None:
            continue
        c90 = (est.ci90.lower, est.ci90.upper) if est.ci90 else None
        c95 = (est.ci95.lower, est.ci95.upper) if est.ci95 else None
        forest_rows.append(plots.ForestRow(tv.task, est.delta, c90, c95, tv.margin, tv.status))
        if est.flips is not None:
            flip_rows.append(plots.FlipRow(tv.task, est.flips.n10, est.flips.n01))
    kl = []
    for d in inp.comparison.distribution:
        if d.metric == "kld" and d.per_chunk:
            kl.append(
                (d.task, plots.kl_plot(f"{d.task}: KL per chunk", [c.value for c in d.per_chunk], d.value))
            )
    kv = plots.kv_error_plot(inp.kv.layers, inp.kv.k_sqnr_db, inp.kv.v_sqnr_db) if inp.kv else None
    return Figures(
        forest=plots.forest_plot(forest_rows) if forest_rows else None,
        flips=plots.flips_plot(flip_rows) if flip_rows else None,
        kl=kl,
        kv=kv,
    )


# ----------------------------------------------------------------------------- markdown

_MARK = {"pass": "✅ PASS", "fail": "❌ FAIL", "inconclusive": "⚠️ INCONCLUSIVE"}
_DIST_LABEL = {
    "kld": "mean KL(base || cand), nats/token",
    "top1_agree": "top-1 token agreement",
    "delta_p": "mean change in p(next token)",
    "log_ppl_ratio": "log perplexity ratio (cand / base)",
}


def _dist_row(d: DistributionEstimate) -> list[str]:
    def g(x: float | None) -> str:
        return "-" if x is None else f"{x:.4g}"

    ci = "-" if d.ci95 is None else f"[{d.ci95.lower:.4g}, {d.ci95.upper:.4g}]"
    return [
        d.task,
        _DIST_LABEL[d.metric],
        g(d.value),
        g(d.se),
        g(d.se_naive),
        ci,
        g(d.p99),
        g(d.p999),
        g(d.max),
        f"{d.n_tokens} / {d.n_chunks}",
    ]


DIST_HEADERS = (
    "task",
    "statistic",
    "value",
    "SE (by chunk)",
    "SE (naive)",
    "95% CI",
    "p99",
    "p99.9",
    "max",
    "tokens / chunks",
)


def _md_cell(cell: Cell) -> str:
    return md_cell(cell.main) + (f"<br>{md_cell(cell.sub)}" if cell.sub else "")


def _md_table(headers: tuple[str, ...] | list[str], rows: list[list[str]], raw: bool = False) -> list[str]:
    """A Markdown table; cells are escaped here unless `raw` (already escaped)."""
    out = ["| " + " | ".join(md_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(c if raw else md_cell(c) for c in r) + " |" for r in rows]
    return out


def render_markdown(inp: ReportInputs, plot_files: dict[str, str] | None = None) -> str:
    """report.md: the same content as the HTML, tables in Markdown, figures linked as files."""
    v, c = inp.verdict, inp.comparison
    plot_files = plot_files or {}
    lines = [
        f"# {_MARK[v.status]}",
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
        lines.append(f"- {_MARK[t.status]} **{md_cell(t.task)}** ({md_cell(t.metric)}): {md_cell(t.reason)}")
        lines += [f"  - warning: {md_cell(w)}" for w in t.warnings]
    for note in floor_notes(inp):
        lines += ["", f"> **Accuracy carries no information here.** {md_cell(note)}"]
    for note in engine_notes(inp.run_dir):
        lines += ["", f"> **Not deterministic.** {md_cell(note)}"]
    headers = [_k_label(v) if h == "k-SE rule" else h for h in HEADERS]
    cells = [table_row(t, gated_estimate(c, t)) for t in v.tasks]
    lines += ["", "## Results", ""] + _md_table(headers, [[_md_cell(x) for x in r] for r in cells], raw=True)
    fam = family_false_alarm(v)
    if fam is not None:
        lines += [
            "",
            f"Chance that at least one task fails the k-SE rule for an identical candidate: {percent(fam)}.",
        ]
    for key, title in (
        ("forest", "Forest plot of delta"),
        ("flips", "Flips"),
        ("kv", "Per-layer KV-cache error"),
    ):
        if key in plot_files:
            lines += ["", f"## {title}", "", f"![{title}]({plot_files[key]})"]
    if c.distribution:
        lines += ["", "## Distribution statistics (teacher-forced)", ""] + _md_table(
            DIST_HEADERS, [_dist_row(d) for d in c.distribution]
        )
    lines += ["", "## Changed answers", ""] + _md_examples(inp)
    lines += ["", "## Methods and conventions", ""] + [f"- {md_cell(m)}" for m in methods(inp)]
    lines += ["", "## Provenance", ""] + [f"- {md_cell(k)}: {md_cell(val)}" for k, val in provenance(inp)]
    return "\n".join(lines) + "\n"


def _md_examples(inp: ReportInputs) -> list[str]:
    out = []
    for task, exs in inp.examples.items():
        if not exs:
            continue
        if redacted(task):
            ids = ", ".join(f"{e.item_id}#{e.repeat} ({e.direction})" for e in exs)
            out.append(f"- {md_cell(task)} (record ids only): {md_cell(ids)}")
            continue
        for e in exs:
            out.append(
                f"- {md_cell(task)} {md_cell(e.item_id)}#{e.repeat} {e.direction}: target {md_cell(_clip(e.target))}; "
                f"baseline {md_cell(_clip(e.extracted_baseline))}; candidate {md_cell(_clip(e.extracted_candidate))}"
            )
    return out or ["- none recorded (no records in this run directory, or no score changed)"]


def methods(inp: ReportInputs) -> list[str]:
    """The conventions and methods, one sentence each (plain text)."""
    v, c = inp.verdict, inp.comparison
    ci_methods = sorted({e.ci_method for e in c.estimates})
    out = [
        c.sign_convention + "; t reference with n - 1 df (G - 1 for clustered items)",
        (
            f"CI methods in this comparison: {', '.join(ci_methods) or '-'} (paired_t: paired t on item differences; "
            "cluster_cr1_t: cluster-robust CR1; tango_score: Tango score interval for paired proportions)"
        ),
        (
            "Non-inferiority passes when the lower limit of the (1 - 2 alpha) CI lies above -margin and fails when "
            "the upper limit lies below it; several tasks form an intersection-union test (Berger 1982), each at alpha"
        ),
        "Underpowered: MDE = (z_(1-alpha) + z_power) x SE_paired exceeds the margin, or n < min_n",
        (
            "The k-SE rule |delta| <= k x SE is reported, not trusted: its false-alarm rate for an identical candidate is "
            "2 (1 - Phi(k SE_basis / SE_paired)) (13.4% per task on the paired basis at k = 1.5), its threshold shrinks "
            "as 1/sqrt(n) (vacuous on small sets, strict on large ones) and false alarms compound across tasks"
        ),
        "McNemar: exact two-sided binomial on discordant pairs and mid-p (Fagerland et al. 2013); n10 == n01 gives p = 1",
        "Flips and answer agreement: Wilson 95% intervals; KL divergence SEs are clustered by text chunk",
        f"Policy: {v.policy.name}; "
        + "; ".join(f"{t.task}: margin {100 * t.margin:.1f} pts, alpha {t.alpha:g}" for t in v.tasks),
    ]
    return out


def provenance(inp: ReportInputs) -> list[tuple[str, str]]:
    """Key/value lines naming where every number came from (values are raw text)."""
    out = [
        ("run directory", str(inp.run_dir)),
        ("comparison.json sha256", inp.verdict.comparison_sha256 or "-"),
        ("policy sha256", inp.verdict.policy_sha256),
        ("verdict", inp.verdict_source),
    ]
    if inp.env:
        out += _flat_env(inp.env)
    return out


# ----------------------------------------------------------------------------- html

_CSS = """
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


def _html_cell(cell: Cell) -> str:
    return _e(cell.main) + (f"<br><small>{_e(cell.sub)}</small>" if cell.sub else "")


def _html_table(headers: tuple[str, ...] | list[str], rows: list[list[str]], num_cols: set[int]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for r in rows:
        cells = "".join(
            f'<td class="num">{c}</td>' if i in num_cols else f"<td>{c}</td>" for i, c in enumerate(r)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


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
    for note in engine_notes(inp.run_dir):
        parts.append(f'<div class="callout"><b>Not deterministic.</b> {_e(note)}</div>')
    rows = []
    for t in v.tasks:
        cells = [_html_cell(x) for x in table_row(t, gated_estimate(c, t))]
        cells[0] = f"<b>{_e(t.task)}</b><br><small>{_e(t.metric)}</small>"
        cells[1] = _pill(t.status) + (
            f"<br><small>{_e(KIND_LABELS[t.kind])}</small>" if t.kind != "decided" else ""
        )
        rows.append(cells)
    headers = [_k_label(v) if h == "k-SE rule" else h for h in HEADERS]
    parts += ["<h2>Results</h2>", '<div class="scroll">', _html_table(headers, rows, set(NUM_COLS)), "</div>"]
    fam = family_false_alarm(v)
    if fam is not None:
        parts.append(
            f"<p>Chance that at least one task fails the k-SE rule although the candidate is identical: "
            f"<b>{_e(percent(fam))}</b>.</p>"
        )
    if figs.forest:
        parts += [
            "<h2>Forest plot of delta</h2>",
            _img(figs.forest, "forest plot of delta with 90% and 95% CIs"),
        ]
    if figs.flips:
        parts += ["<h2>Flips</h2>", _img(figs.flips, "regressions and improvements per task")]
    if c.distribution or figs.kl:
        parts.append("<h2>Distribution statistics (teacher-forced)</h2>")
        if c.distribution:
            parts.append(
                _html_table(
                    DIST_HEADERS, [[_e(x) for x in _dist_row(d)] for d in c.distribution], set(range(2, 10))
                )
            )
        parts += [_img(png, f"KL divergence per chunk, {task}") for task, png in figs.kl]
    if figs.kv:
        parts += ["<h2>Per-layer KV-cache error</h2>", _img(figs.kv, "per-layer SQNR of K and V")]
    parts += ["<h2>Changed answers</h2>", _html_examples(inp)]
    parts += (
        ["<h2>Methods and conventions</h2><ul>"] + [f"<li>{_e(m)}</li>" for m in methods(inp)] + ["</ul>"]
    )
    parts += [
        "<h2>Provenance</h2>",
        _html_table(["item", "value"], [[_e(k), _e(val)] for k, val in provenance(inp)], set()),
    ]
    if inp.spec_text is not None:
        parts += ["<h3>spec.toml</h3>", f"<pre>{_e(_spec_redacted(inp.spec_text))}</pre>"]
    parts.append("</main>")
    title = f"{v.status.upper()}: {c.candidate} vs {c.baseline}"
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>\n"
    )


def _html_examples(inp: ReportInputs) -> str:
    out = []
    for task, exs in inp.examples.items():
        if not exs:
            continue
        if redacted(task):
            ids = ", ".join(f"{e.item_id}#{e.repeat} ({e.direction})" for e in exs)
            out.append(f"<p><b>{_e(task)}</b> (record ids only): {_e(ids)}</p>")
            continue
        generative = any(e.completion_baseline is not None or e.completion_candidate is not None for e in exs)
        headers = ["item", "direction", "target", "baseline answer", "candidate answer"]
        rows = []
        for e in exs:
            row = [
                _e(f"{e.item_id}#{e.repeat}"),
                _e(e.direction),
                _e(_clip(e.target)),
                _e(_clip(e.extracted_baseline)),
                _e(_clip(e.extracted_candidate)),
            ]
            if generative:
                row += [
                    f"<pre>{_e(_clip(e.completion_baseline))}</pre>",
                    f"<pre>{_e(_clip(e.completion_candidate))}</pre>",
                ]
            rows.append(row)
        if generative:
            headers += ["baseline completion", "candidate completion"]
        out.append(f"<h3>{_e(task)}</h3>")
        out.append(_html_table(headers, rows, set()))
    return "".join(out) or "<p>None recorded (no records in this run directory, or no score changed).</p>"


# ----------------------------------------------------------------------------- entry point


@dataclass(frozen=True)
class ReportPaths:
    """The files one render wrote."""

    markdown: Path
    html: Path
    plots: list[Path]


def render(run_dir: Path, policy: Policy | None = None, out_dir: Path | None = None) -> ReportPaths:
    """Write report.md, report.html and plots/*.png for `run_dir` (into `out_dir`, default run_dir)."""
    out_dir = out_dir or run_dir
    inp = gather(run_dir, policy)
    figs = make_figures(inp)
    written: dict[str, Path] = {}
    for name, png in (("forest", figs.forest), ("flips", figs.flips), ("kv", figs.kv)):
        if png is not None:
            written[name] = out_dir / "plots" / f"{name}.png"
            atomic_write_bytes(written[name], png)
    md = out_dir / "report.md"
    page = out_dir / "report.html"
    atomic_write_text(md, render_markdown(inp, {k: f"plots/{p.name}" for k, p in written.items()}))
    atomic_write_text(page, render_html(inp, figs))
    return ReportPaths(markdown=md, html=page, plots=list(written.values()))
