"""The power plan before any compute (`qa run --dry-run` and the start of every `qa run`): per task the
items and repeats the spec runs, the resolved policy's margin, alpha and power, the sd of the paired
difference from a prior, the minimum detectable effect (MDE) it implies, and whether the margin is
reachable (MDE <= margin and n >= min_n, as the gate decides it in qa.gate.rules).

Priors, first match wins: `--plan-prior TASK=SD`; the gated estimate of the same task in an earlier run
of the same model (`--plan-from RUN_DIR`, its comparison.json); the table qa/policies/plan_priors.toml
(measured values, each naming its report); the table's conservative default. Formulas: qa.stats.power.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from qa.errors import PolicyError, QAError
from qa.files.comparison import ReferenceEstimate, load_comparison
from qa.files.policy import Policy, TaskPolicy
from qa.gate.rules import no_information, select_estimate
from qa.plan.sample_size import sample_size_plan
from qa.stats.intervals import degenerate_interval
from qa.stats.power import items_needed, z_total
from qa.textfmt import pts
from quant.validation import did_you_mean

PRIORS_FILE = "plan_priors.toml"
MARGIN_RULES = ("noninferiority", "tost")


class PlanError(QAError):
    """A bad plan option (a prior that is not a positive number, an unusable run) or, with
    --strict-plan, a margin the plan shows unreachable."""


@dataclass(frozen=True)
class Prior:
    """The sd of the paired difference of one task's gated estimate, and where it comes from."""

    sd: float
    source: str
    metric: str | None = None  # the estimate it was measured on (None: any)
    model: str | None = None  # the model it was measured on (None: any)
    repeats: int = 1
    no_information: str | None = None  # why accuracy told nothing where it was measured
    reference: ReferencePrior | None = None  # the reference-answer signal measured there


@dataclass(frozen=True)
class ReferencePrior:
    """The reference-answer signal of one task in an earlier run (qa.compare.reference), per item, nats/token:
    the sd of the change in mean log-prob, the mean KL and its sd (sd = SE * sqrt(n))."""

    n: int
    sd_logprob: float
    kl: float
    sd_kl: float


@dataclass(frozen=True)
class PlanOptions:
    """What the CLI (or a caller of qa.api.run) sets: explicit priors, an earlier run, strictness."""

    priors: dict[str, float] = field(default_factory=dict)  # task -> sd of the paired difference
    from_run: Path | None = None
    strict: bool = False


class CountedTask(Protocol):
    """A task as a run runs it (qa.pipeline.resolved_run.ResolvedTask is one): items after the limit, repeats,
    whether it samples."""

    @property
    def name(self) -> str: ...
    @property
    def items_available(self) -> int: ...
    @property
    def n_items(self) -> int: ...
    @property
    def repeats(self) -> int: ...
    @property
    def sampled(self) -> bool: ...


@dataclass(frozen=True, kw_only=True)
class TaskPlan:
    """One task's plan; `sd` None means not planned (`note` says why)."""

    task: str
    items_available: int
    items: int
    repeats: int
    sampled: bool = False
    metric: str
    margin: float
    alpha: float
    power: float
    min_n: int
    sd: float | None = None
    source: str = "-"
    mde: float | None = None
    items_needed: int | None = None  # items that reach the margin (at least min_n); None: none can
    note: str = ""
    reference_reachable: bool | None = None  # a no-information task: can the reference-answer rules pass?

    @property
    def planned(self) -> bool:
        """True when a prior gave this task an MDE."""
        return self.sd is not None

    @property
    def reachable(self) -> bool | None:
        """MDE <= margin and n >= min_n at the spec's items; None when not planned."""
        if not self.planned:
            return None
        return self.items_needed is not None and self.items >= self.items_needed

    def why_unreachable(self) -> str:
        """One sentence: what is short and what would reach the margin."""
        if self.reference_reachable is False:
            return f"{self.task}: {self.note}"
        short = (f"n = {self.items} < min_n {self.min_n}" if self.items < self.min_n
                 else f"MDE {pts(self.mde, signed=False)} > margin {pts(self.margin, signed=False)}")
        if self.items_needed is None:
            need = "no item count reaches it"
        elif self.items_needed > self.items_available:
            need = f"needs about {self.items_needed} items, more than the task offers ({self.items_available})"
        else:
            need = f"needs about {self.items_needed} items"
        return f"{self.task}: margin unreachable at {self.items} items ({short}, sd {self.sd:.4g} from {self.source}); {need}"


@dataclass(frozen=True)
class RunPlan:
    """The plan of every task of a spec."""

    tasks: tuple[TaskPlan, ...]

    def unreachable(self) -> list[TaskPlan]:
        """The planned tasks whose margin the spec's items cannot reach (accuracy or reference answers)."""
        return [t for t in self.tasks if t.reachable is False or t.reference_reachable is False]

    def warnings(self) -> list[str]:
        """One line per unreachable margin."""
        return [f"plan: {t.why_unreachable()}" for t in self.unreachable()]


def _priors_table(text: str | None = None) -> dict[str, Any]:
    if text is None:
        text = resources.files("qa").joinpath("policies", PRIORS_FILE).read_text(encoding="utf-8")
    return tomllib.loads(text)


def table_priors(text: str | None = None) -> tuple[dict[str, Prior], dict[str, float]]:
    """The measured priors of qa/policies/plan_priors.toml (or `text`) by task, and its [default] table."""
    data = _priors_table(text)
    out = {}
    for task, row in data.get("tasks", {}).items():
        ref = row.get("reference")
        out[task] = Prior(sd=float(row["sd_diff"]), metric=row.get("metric"), model=row.get("model"),
                          repeats=int(row.get("repeats", 1)), no_information=row.get("no_information"),
                          source=f"{row['source']} (n = {row['n']}, {row.get('model', 'any model')})",
                          reference=None if ref is None else ReferencePrior(
                              n=int(ref["n"]), sd_logprob=float(ref["sd_logprob"]), kl=float(ref["kl"]),
                              sd_kl=float(ref["sd_kl"])))
    return out, {k: float(v) for k, v in data["default"].items()}


def default_prior(defaults: dict[str, float], repeats: int, sampled: bool) -> Prior:
    """The table's conservative default: sqrt(flip rate) greedy; `qa plan`'s model when sampling."""
    if not sampled:
        f = defaults["flip_rate"]
        return Prior(sd=math.sqrt(f), source=f"default: greedy, flip rate {f:g}")
    p, rho, w = defaults["accuracy"], defaults["rho"], defaults["within_share"]
    per_sample = sample_size_plan("-", 0.02, accuracy=p, rho=rho).sd_diff
    sd = per_sample * math.sqrt(1 - w + w / repeats)  # qa.plan.sample_size's model of K repeats
    return Prior(sd=sd, repeats=repeats,
                 source=f"default: sampled, accuracy {p:g}, rho {rho:g}, within share {w:g}, {repeats} repeats")


def parse_prior_options(values: Sequence[str]) -> dict[str, float]:
    """`--plan-prior TASK=SD` values as {task: sd}; PlanError unless SD is a positive finite number."""
    out: dict[str, float] = {}
    for value in values:
        task, sep, number = value.partition("=")
        if not sep or not task.strip():
            raise PlanError(f"--plan-prior {value!r}: write TASK=SD, e.g. --plan-prior gsm8k=0.15")
        try:
            sd = float(number)
        except ValueError:
            sd = math.nan
        if not math.isfinite(sd) or sd <= 0:
            raise PlanError(f"--plan-prior {value!r}: the sd of the paired difference must be a positive number, "
                            f"got {number.strip()!r}")
        out[task.strip()] = sd
    return out


def run_priors(run_dir: Path, model: str, policy: Policy, tasks: Sequence[str]) -> dict[str, Prior]:
    """Priors from an earlier run of the same model: each task's gated estimate in RUN_DIR/comparison.json
    (RUN_DIR may be a run root or a candidates/<name>/ folder of a several-candidate run)."""
    if not (run_dir / "comparison.json").is_file():
        raise PlanError(f"--plan-from {run_dir}: no comparison.json there (a run directory, or its "
                        "candidates/<name>/ folder for a run with several candidates)")
    spec_file = next((p / "spec.toml" for p in (run_dir, run_dir.parent.parent) if (p / "spec.toml").is_file()), None)
    if spec_file is None:
        raise PlanError(f"--plan-from {run_dir}: no spec.toml, so its model is unknown")
    try:
        theirs = tomllib.loads(spec_file.read_text(encoding="utf-8")).get("model")
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"--plan-from {spec_file}: not valid TOML ({exc})") from None
    if theirs != model:
        raise PlanError(f"--plan-from {run_dir}: that run's model is {theirs!r}, this spec's {model!r}; "
                        "a prior must come from the same model")
    comparison = load_comparison(run_dir / "comparison.json")
    out = {}
    for task in dict.fromkeys(e.task for e in comparison.estimates if e.task in tasks):
        try:
            est = select_estimate(comparison, task, policy.for_task(task), explicit=task in policy.tasks)
        except PolicyError:  # the policy gates a metric that run lacks: no prior from it
            continue
        if est.sd_diff is None:
            continue
        ref = next((r for r in comparison.reference if r.task == task and r.n > 1), None)
        out[task] = Prior(sd=est.sd_diff, metric=f"{est.metric},{est.filter}", model=model, repeats=est.repeats,
                          no_information=no_information(est), source=f"{run_dir} (n = {est.n})",
                          reference=None if ref is None else reference_prior(ref))
    return out


def reference_prior(ref: ReferenceEstimate) -> ReferencePrior | None:
    """A ReferenceEstimate's per-item sds (None when an SE is undefined)."""
    lp, kl = ref.delta_logprob, ref.kld
    if lp is None or kl is None or lp.se is None or kl.se is None:
        return None
    return ReferencePrior(n=ref.n, sd_logprob=lp.se * math.sqrt(ref.n), kl=kl.value, sd_kl=kl.se * math.sqrt(ref.n))


def plan_reference(plan: TaskPlan, tp: TaskPolicy, prior: Prior) -> TaskPlan:
    """A task whose accuracy carries no information (or whose policy says the reference answers decide it
    instead of accuracy), planned on what decides it: the reference-answer rules
    (qa.gate.reference: delta log-prob above -margin, KL below its margin, nats/token), when a prior has them."""
    lead = (f"accuracy carries no information ({prior.source}: {prior.no_information})"
            if tp.reference_gate != "instead_of_accuracy" else "the policy decides it on the reference answers")
    if tp.reference_gate == "never":
        return replace(plan, note=f"not planned: {lead} and reference_gate = \"never\": inconclusive")
    ref = prior.reference
    if ref is None:
        return replace(plan, note=f"not planned: {lead}; the reference-answer signal decides (margins "
                                  f"{tp.reference_logprob_margin:g} / {tp.reference_kl_margin:g} nats/token), "
                                  "no prior for it: pass --plan-from an earlier run that recorded it")
    z = z_total(tp.alpha, tp.power) / math.sqrt(max(plan.items, 1))
    mde_lp, kl_high = z * ref.sd_logprob, ref.kl + z * ref.sd_kl
    ok = mde_lp <= tp.reference_logprob_margin and kl_high <= tp.reference_kl_margin and plan.items >= 2
    note = (f"{lead}; the reference-answer signal decides: at {plan.items} items delta log-prob MDE {mde_lp:.4f} vs "
            f"margin {tp.reference_logprob_margin:g}, KL {ref.kl:.4f} + MDE {z * ref.sd_kl:.4f} vs margin "
            f"{tp.reference_kl_margin:g} nats/token (sds from {ref.n} items): {'reachable' if ok else 'unreachable'}")
    return replace(plan, note=note, reference_reachable=ok)


def choose_prior(count: CountedTask, tp: TaskPolicy, model: str, explicit: dict[str, float],
                 earlier: dict[str, Prior], table: dict[str, Prior], defaults: dict[str, float]) -> Prior:
    """The first prior that applies: explicit, the earlier run (same metric), the table (same metric; greedy
    tasks only: it was measured greedy), the default."""
    if count.name in explicit:
        return Prior(sd=explicit[count.name], source="--plan-prior")
    for prior in (earlier.get(count.name), table.get(count.name)):
        if prior is None or (tp.metric is not None and prior.metric not in (None, tp.metric)):
            continue
        if prior.no_information is not None and prior.model != model:
            continue  # the sd of another model's floor says nothing here
        if count.sampled and prior is table.get(count.name):
            continue  # the table was measured greedy; sampling adds within-item noise
        return prior
    return default_prior(defaults, count.repeats, count.sampled)


def plan_task(count: CountedTask, tp: TaskPolicy, prior: Prior, model: str) -> TaskPlan:
    """One task's plan under its resolved policy and prior."""
    n = getattr(count, "gated_items", count.n_items)  # a session task's estimate pairs one path of its items
    base = TaskPlan(task=count.name, items_available=count.items_available, items=n,
                    repeats=count.repeats, sampled=count.sampled, metric=tp.metric or prior.metric or "auto", margin=tp.margin, alpha=tp.alpha,
                    power=tp.power, min_n=tp.min_n, source=prior.source)
    if not any(r in MARGIN_RULES for r in tp.rules):
        return replace(base, source="-", note=f"not planned: gated on {', '.join(tp.rules)} only (no margin)")
    if (prior.no_information is not None and prior.model == model) or tp.reference_gate == "instead_of_accuracy":
        return plan_reference(base, tp, prior)
    needed = items_needed(prior.sd, tp.margin, tp.alpha, tp.power)
    if n < 2:
        mde = None
    elif prior.sd > 0:
        mde = z_total(tp.alpha, tp.power) * prior.sd / math.sqrt(n)
    else:  # every difference equal: the exact bound is the limit (qa.stats.power.mde)
        mde = -degenerate_interval(0.0, n, 1.0, 1 - 2 * tp.alpha).lower
    notes = [runs] if (runs := getattr(count, "plan_note", "")) else []  # what the task runs, where it says
    if tp.looks:
        notes.append(f"sequential looks {list(tp.looks)}: planned at fixed n; the last look's adjusted level "
                     "widens the final interval a little")
    if prior.repeats != count.repeats:
        notes.append(f"prior measured at {prior.repeats} repeat(s), spec runs {count.repeats}")
    return replace(base, sd=prior.sd, mde=mde, items_needed=None if needed is None else max(needed, tp.min_n),
                    note="; ".join(notes))


def plan_run(counts: Sequence[CountedTask], policy: Policy, model: str, options: PlanOptions | None = None,
             priors_text: str | None = None) -> RunPlan:
    """The plan of every task: priors chosen per task (see the module docstring), then plan_task."""
    options = options or PlanOptions()
    names = [c.name for c in counts]
    for task in options.priors:
        if task not in names:
            raise PlanError(f"--plan-prior {task}=...: no task {task!r} in the spec; "
                            f"{did_you_mean(task, names, listing='tasks')}")
    earlier = run_priors(options.from_run, model, policy, names) if options.from_run is not None else {}
    table, defaults = table_priors(priors_text)
    out = []
    for c in counts:
        tp = policy.for_task(c.name)
        out.append(plan_task(c, tp, choose_prior(c, tp, model, options.priors, earlier, table, defaults), model))
    return RunPlan(tuple(out))


def plan_lines(plan: RunPlan) -> list[str]:
    """The plan as a plain-text table (one row per task) followed by its notes and prior sources."""
    head = ("task", "gated on", "items", "reps", "margin", "alpha", "power", "sd(d)", "MDE", "reachable",
            "items needed")
    rows = [head]
    for t in plan.tasks:
        reach = "-" if t.reachable is None else "yes" if t.reachable else "NO"
        if t.reference_reachable is not None:
            reach = "yes (ref)" if t.reference_reachable else "NO (ref)"
        need = "-" if not t.planned else "none" if t.items_needed is None else str(t.items_needed)
        rows.append((t.task, t.metric, str(t.items), str(t.repeats), pts(t.margin, signed=False), f"{t.alpha:g}",
                     f"{t.power:g}", "-" if t.sd is None else f"{t.sd:.4g}", pts(t.mde, signed=False), reach, need))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for t in plan.tasks:
        if t.planned:
            lines.append(f"  {t.task}: prior {t.source}" + (f"; {t.note}" if t.note else ""))
        elif t.note:
            lines.append(f"  {t.task}: {t.note}")
    return lines


def check_plan(plan: RunPlan, strict: bool) -> list[str]:
    """The plan's warnings; with `strict`, PlanError (one line) when any margin is unreachable."""
    bad = plan.unreachable()
    if strict and bad:
        raise PlanError("--strict-plan: " + "; ".join(t.why_unreachable() for t in bad))
    return plan.warnings()


def announce_plan(plan: RunPlan, strict: bool = False) -> None:
    """Print the plan and its warnings (the start of `qa run`); PlanError under --strict-plan."""
    print("power plan (before any arm starts):" if plan.tasks else "power plan: no tasks to plan")
    for line in plan_lines(plan) if plan.tasks else []:
        print("  " + line, flush=True)
    for w in check_plan(plan, strict):
        print(f"warning: {w}", flush=True)
