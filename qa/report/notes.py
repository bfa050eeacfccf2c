"""The report's sentences (plain text, escaped by the renderer): call-outs for tasks where accuracy
carries no information, where an arm truncated, and for non-deterministic engines, the methods, and the provenance lines with
secrets redacted."""

from __future__ import annotations

import json
import re

from qa.files.portable import portable_dir
from qa.report.gather import ReportInputs, gated_estimate
from qa.textfmt import pts

MAX_COMPLETION_CHARS = 600
MAX_ENV_CHARS = 200
SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password|authorization)", re.IGNORECASE)


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


def truncation_notes(inp: ReportInputs) -> list[str]:
    """Plain-text call-outs for gated tasks where either arm truncated (reached max_tokens before its
    final answer): counts, rates, the paired change and what the truncation rule said."""
    notes = []
    for tv in inp.verdict.tasks:
        gen = inp.comparison.generation_for(tv.task)
        if gen is None or gen.truncation is None or not (gen.baseline.truncated or gen.candidate.truncated):
            continue
        b, c, t = gen.baseline, gen.candidate, gen.truncation
        text = (f"{tv.task}: the candidate truncated {c.truncated} of {c.n_samples} samples "
                f"({100 * (c.truncation_rate or 0):.1f}%), the baseline {b.truncated} "
                f"({100 * (b.truncation_rate or 0):.1f}%); paired change {pts(t.delta)}")
        tr = next((r for r in tv.rules if r.rule == "truncation"), None)
        if tr is not None:
            text += f"; truncation rule {tr.status}{'' if tr.decides else ' (reported only)'}: {tr.detail}"
        notes.append(text + ". A truncated sample is scored on whatever answer it reached; see its records.")
    return notes


def engine_notes(inp: ReportInputs) -> list[str]:
    """One line per arm whose engine says it is not bit-reproducible (and whether a rerun arm measured that)."""
    measured = any(a.arm == "rerun" for a in inp.arms)
    floor = ("the run's rerun arm measures that noise floor (its A/A rows)" if measured
             else "add an [arms.rerun] to measure that noise floor")
    return [
        f"arm {a.arm}: engine {a.engine!r} is not deterministic, so a rerun of the same arm can flip answers "
        f"by itself; {floor}."
        for a in inp.arms
        if a.deterministic is False
    ]


def methods(inp: ReportInputs) -> list[str]:
    """The conventions and methods, one sentence each (plain text)."""
    v, c = inp.verdict, inp.comparison
    ci_methods = sorted({e.ci_method for e in c.estimates})
    return [
        c.sign_convention + "; t reference with n - 1 df (G - 1 for clustered items)",
        (
            f"CI methods in this comparison: {', '.join(ci_methods) or '-'} (paired_t: paired t on item differences; "
            "cluster_cr1_t: cluster-robust CR1, never below the item-level SE; tango_score: Tango score interval for paired proportions; "
            "degenerate: every difference equal, exact binomial bound 1 - a^(1/n) on the share of items that "
            "could differ, times the score range)"
        ),
        (
            "Non-inferiority passes when the lower limit of the (1 - 2 alpha) CI lies above -margin and fails when "
            "the upper limit lies below it; several tasks form an intersection-union test (Berger 1982), each at alpha"
        ),
        (
            "Underpowered: MDE = (z_(1-alpha) + z_power) x SE_paired (degenerate estimates: the distance from delta "
            "to the exact bound's lower limit) exceeds the margin, or n < min_n"
        ),
        (
            "The k-SE rule |delta| <= k x SE is reported, not trusted: its false-alarm rate for an identical candidate is "
            "2 (1 - Phi(k SE_basis / SE_paired)) (13.4% per task on the paired basis at k = 1.5), its threshold shrinks "
            "as 1/sqrt(n) (vacuous on small sets, strict on large ones) and false alarms compound across tasks"
        ),
        (
            "McNemar: exact two-sided binomial on discordant items and mid-p (Fagerland et al. 2013); with several "
            "repeats the same test on item-mean differences (sign test); n10 == n01 gives p = 1"
        ),
        "Flips and answer agreement: Wilson 95% intervals; KL divergence SEs are clustered by text chunk",
        (
            "Truncation (a sample that reached max_tokens before its final answer): per arm, Wilson 95% intervals "
            "(on the effective sample size when repeats or clusters correlate samples); the paired change in "
            "truncation rate and in output tokens uses the accuracy methods above; the truncation rule passes "
            "when the upper limit of the (1 - 2 alpha) CI lies below +truncation_margin and fails when its lower "
            "limit lies above it; neither arm truncating is a pass, records that do not say are not gated"
        ),
        f"Policy: {v.policy.name}; "
        + "; ".join(f"{t.task}: margin {100 * t.margin:.1f} pts, alpha {t.alpha:g}" for t in v.tasks),
    ]


def flat_env(env: dict[str, object], prefix: str = "", depth: int = 0) -> list[tuple[str, str]]:
    """env.json as (dotted key, value) lines, two levels deep; secret-looking keys redacted, long values cut."""
    out: list[tuple[str, str]] = []
    for k, v in env.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and depth < 2:
            out += flat_env(v, key + ".", depth + 1)
            continue
        text = "[redacted]" if SECRET_KEY.search(str(k)) else json.dumps(v) if not isinstance(v, str) else v
        out.append((key, text if len(text) <= MAX_ENV_CHARS else text[:MAX_ENV_CHARS] + " ..."))
    return out


def provenance(inp: ReportInputs) -> list[tuple[str, str]]:
    """Key/value lines naming where every number came from (values are raw text)."""
    out = [
        ("run directory", portable_dir(inp.run_dir)),
        ("comparison.json sha256", inp.verdict.comparison_sha256 or "-"),
        ("policy sha256", inp.verdict.policy_sha256),
        ("verdict", inp.verdict_source),
    ]
    if inp.env:
        out += flat_env(inp.env)
    return out


def spec_redacted(spec: str) -> str:
    """spec.toml with the value of every secret-looking key replaced by "[redacted]"."""
    lines = []
    for line in spec.splitlines():
        key = line.split("=", 1)[0]
        lines.append(f'{key}= "[redacted]"' if "=" in line and SECRET_KEY.search(key) else line)
    return "\n".join(lines)


def clip(text: str | None) -> str:
    """Text cut to MAX_COMPLETION_CHARS ('-' for None)."""
    if text is None:
        return "-"
    return text if len(text) <= MAX_COMPLETION_CHARS else text[:MAX_COMPLETION_CHARS] + " ... [truncated]"
