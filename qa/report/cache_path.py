"""The report's "Cache path" section (comparison.json `cache_path`, qa.compare.cache_path): per sessions
task, each arm's warm path against its own cold path (prefix-cache hit rate, identical outputs, first
divergence, KL(cold || warm), flips), per turn depth, the shuffled batch-history A/A floor, the
candidate next to the baseline (excess flips, KL difference, warm accuracy vs the baseline's cold path)
and the gate's cache-path rules (qa.gate.cache_path); an hf arm whose emulated prefix cache replays is labelled
from its engine arguments in resolved.json."""

from __future__ import annotations

from evals.engines import parse_engine_args
from evals.engines.hf.args import HFEngineArgs
from qa.files.comparison import AgreementShare, CacheArm, CachePathEstimate, CacheTurn, Flips, Interval
from qa.files.resolved_json import ResolvedRecord
from qa.files.verdict import TaskVerdict
from qa.report.document import Paragraph, Section, bullets, line, table
from qa.report.gather import ReportInputs
from qa.textfmt import percent, pts

TITLE = "Cache path"
CAPTION = ("Each turn of a session served cold (no reusable prefix) and warm (right after its prefix) in each "
           "arm; the per-task results above use the cold path only. Hit rate: share of the warm path's prompt "
           "tokens the engine reported serving from its prefix cache (0 or not reported: no information). First "
           "divergence: median character offset of the first difference between the warm and cold completions. "
           "KL(cold || warm): nats/token on the turn's fixed teacher-forced continuation. Intervals are 95%, "
           "clustered by session. A/A floor: the cold prompts served again in a shuffled order and batch size.")
ARM_HEADERS = ("arm", "warm hit rate", "cold hit rate", "identical outputs (95% CI)", "first divergence (chars)",
               "KL(cold || warm) (95% CI)", "top-1 agreement", "flips warm vs cold", "A/A floor: identical outputs",
               "A/A floor: identical top-k")
TURN_HEADERS = ("turn", "arm", "pairs", "hit rate", "identical outputs", "first divergence (chars)",
                "KL(cold || warm) (95% CI)", "flips")


def _pct(x: float | None) -> str:
    return "0%" if x == 0 else percent(x)  # an exact 0 (no hit at all) is not "<0.01%"


def _share(s: AgreementShare | None) -> str:
    if s is None:
        return "-"
    lo = _pct(s.ci95.lower if s.ci95.lower > 1e-9 else 0.0)  # Wilson's lower limit at 0 of n is 0 up to rounding
    return f"{s.agree}/{s.n} ({_pct(s.share)}, [{lo}, {_pct(s.ci95.upper)}])"


def _kl(value: float | None, ci: Interval | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" + (f" [{ci.lower:.4g}, {ci.upper:.4g}]" if ci is not None else "")


def _rate(rate: float | None) -> str:
    return "not reported" if rate is None else _pct(rate)


def _flips(flips: dict[str, Flips]) -> str:
    return "; ".join(f"{k}: {f.n10 + f.n01}/{f.n} ({f.n10} worse warm, {f.n01} better)" for k, f in flips.items()) or "-"


def _offset(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def arm_row(arm: CacheArm) -> list[str]:
    """One row of the per-arm table (ARM_HEADERS), plain text."""
    kld = arm.kld
    tokens = f" ({arm.cached_tokens} of {arm.prompt_tokens} tokens)" if arm.hit_rate is not None else ""
    floor = arm.floor
    return [arm.arm, _rate(arm.hit_rate) + tokens, _rate(arm.cold_hit_rate), _share(arm.identical),
            _offset(arm.first_divergence), _kl(kld.value if kld else None, kld.ci95 if kld else None),
            percent(arm.top1_agree.value) if arm.top1_agree else "-", _flips(arm.flips),
            _share(floor.identical_outputs) if floor else "no shuffled pass",
            _share(floor.identical_topk) if floor else "-"]


def turn_row(arm: str, t: CacheTurn) -> list[str]:
    """One row of the per-turn-depth table (TURN_HEADERS), plain text."""
    return [str(t.turn), arm, str(t.n), _rate(t.hit_rate), _share(t.identical), _offset(t.first_divergence),
            _kl(t.kld, t.kld_ci95), _flips(t.flips)]


def comparison_lines(cp: CachePathEstimate, tv: TaskVerdict | None) -> list[str]:
    """The candidate next to the baseline, and the gate's cache-path rules, one plain line each."""
    out = []
    for key, ex in cp.excess_flips.items():
        out.append(f"Excess flips ({key}): {ex.flips_candidate} candidate vs {ex.flips_rerun} baseline warm-vs-cold "
                   f"flips of {ex.n} turns; {ex.only_candidate} only in the candidate, {ex.only_rerun} only in the "
                   f"baseline; one-sided sign test p = {ex.p_excess:.3g}")
    if cp.kld is not None:
        k = cp.kld
        ci = f", 95% CI [{k.ci95.lower:+.4g}, {k.ci95.upper:+.4g}]" if k.ci95 is not None else ""
        out.append(f"KL(cold || warm), candidate - baseline: {k.mean_candidate:.4g} - {k.mean_baseline:.4g} = "
                   f"{k.delta:+.4g} nats/token over {k.n} turns in {k.n_clusters} sessions{ci}")
    for e in cp.accuracy:
        ci = f", 95% CI [{pts(e.ci95.lower)}, {pts(e.ci95.upper)}]" if e.ci95 is not None else ""
        out.append(f"Accuracy ({e.metric},{e.filter}), candidate warm path vs baseline cold path: "
                   f"{_pct(e.mean_baseline)} -> {_pct(e.mean_candidate)} ({pts(e.delta)}{ci}, n = {e.n})")
    for r in (tv.rules if tv is not None else []):
        if r.rule.startswith("cache_"):
            out.append(f"Gate {r.rule} ({'decides' if r.decides else 'reported'}): {r.status}: {r.detail}")
    return out + cp.notes


REPLAY_LABEL = ("vLLM's bounded replay (built for DeepSeek-V4.1's sliding-window layers) applied to a model vLLM "
                "does not replay")  # vLLM 0.32 replays only DeepSeek-V4.1's SWA groups; the emulator has no such model


def replayed_arms(resolved: ResolvedRecord | None) -> dict[str, int]:
    """{arm: replay window} of the run's hf arms whose emulated prefix cache replays, from their engine
    arguments as resolved.json records them ({} for a run directory without resolved.json)."""
    out = {}
    for arm in resolved.arms if resolved is not None else ():
        if arm.engine != "hf" or arm.engine_args is None:
            continue
        args = parse_engine_args("hf", arm.engine_args)
        assert isinstance(args, HFEngineArgs)  # the hf engine's argument model
        prefix = args.kv.prefix_cache if args.kv is not None else None
        if prefix is not None and prefix.enabled and prefix.replay_window > 0:
            out[arm.name] = prefix.replay_window
    return out


def replay_lines(resolved: ResolvedRecord | None) -> list[str]:
    """One line per replaying hf arm: the label that says what its warm path stands for."""
    return [f"Arm {arm}: replay window {w}: {REPLAY_LABEL}" for arm, w in replayed_arms(resolved).items()]


def _tables(cp: CachePathEstimate) -> tuple[list[list[str]], list[list[str]]]:
    arms = [cp.baseline, cp.candidate]
    turns = sorted(((t, a.arm) for a in arms for t in a.per_turn), key=lambda x: (x[0].turn, arms[0].arm != x[1]))
    return [arm_row(a) for a in arms], [turn_row(arm, t) for t, arm in turns]


def _verdict(inp: ReportInputs, task: str) -> TaskVerdict | None:
    return next((t for t in inp.verdict.tasks if t.task == task), None)


def section(inp: ReportInputs) -> Section | None:
    """The section: the caption, then per sessions task its per-arm and per-turn tables and its lines (None
    when no task has a cache path)."""
    if not inp.comparison.cache_path:
        return None
    subs = []
    for cp in inp.comparison.cache_path:
        arm_rows, turn_rows = _tables(cp)
        lines = comparison_lines(cp, _verdict(inp, cp.task)) + replay_lines(inp.resolved)
        subs.append(Section(cp.task, (table(ARM_HEADERS, arm_rows), Paragraph(line("Per turn depth:")),
                                      table(TURN_HEADERS, turn_rows), bullets(lines))))
    return Section(TITLE, (Paragraph(line(CAPTION)), *subs))
