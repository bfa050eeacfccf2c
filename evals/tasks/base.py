"""The task interface: a task turns dataset items into engine requests and scores the results.

A task is composed, not inherited: its items come from the data layer, its prompt follows lm-eval's
definition of the same task (so numbers are comparable with published ones), and its scorer
returns named scores keyed "metric,filter" as lm-eval logs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from evals.engines.base import (
    GenerateRequest,
    GenerateResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    TokenLogprobs,
    TokenLogprobsRequest,
)
from evals.prompts.reasoning import DEFAULT_THINK_TAGS

TaskKind = Literal["generate", "loglikelihood", "token_logprobs"]
Request = GenerateRequest | LoglikelihoodRequest | TokenLogprobsRequest
Result = GenerateResult | LoglikelihoodResult | TokenLogprobs


@dataclass(frozen=True)
class Item:
    """One evaluation item: a stable id (the dataset's own where it has one), the raw document the
    prompt is built from, an optional cluster key (items sharing it are not independent, e.g. a
    WikiText article or a needle (length, depth) cell), and the rendered description + few-shot
    block that precedes the document's text in the prompt ("" for a zero-shot item); `shots` holds
    the same shots as (question, answer) pairs, for the chat turns they become."""

    item_id: str
    doc: Mapping[str, Any]
    cluster: str | None = None
    fewshot: str = ""
    shots: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Scored:
    """What a task's scorer returns for one sample."""

    scores: dict[str, float | None]  # "metric,filter" -> value
    extracted: dict[str, str | None] = field(default_factory=dict)  # filter -> extracted answer
    target: str | None = None
    meta: dict[str, str | int | float | bool | None] = field(default_factory=dict)  # -> SampleRecord.meta


@dataclass(frozen=True)
class TaskOptions:
    """Per-run options a task honours (validated by the spec layer). Generation settings left None
    take the task's defaults (lm-eval's `generation_kwargs`); chat settings follow lm-eval's
    `--apply_chat_template`, `--system_instruction`, `--fewshot_as_multiturn` and chat_template_args."""

    num_fewshot: int | None = None  # None: the task's lm-eval default
    max_tokens: int | None = None  # None: the task's default generation budget
    temperature: float | None = None  # None: the task's default; > 0: sampled decoding, seeded per sample
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: tuple[str, ...] | None = None  # None: the task's stop strings
    chat: bool = False  # render the prompt with the model's chat template
    system_prompt: str | None = None
    fewshot_as_multiturn: bool = False
    chat_template_kwargs: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    think_tags: tuple[str, str] | None = DEFAULT_THINK_TAGS  # reasoning delimiters; None: no reasoning split
    extra: Mapping[str, Any] = field(default_factory=dict)
    reference_signal: bool = True  # teacher-force the task's reference answer (a task with `reference`)


@runtime_checkable
class Task(Protocol):
    name: str
    version: str  # bump when prompts, filters or metrics change: records carry it
    kind: TaskKind

    def items(self, data_dir: Path | None) -> list[Item]:
        """Every item of the evaluation split, in the dataset's stable order."""
        ...

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """The engine request for one sample; `seed` is the per-(item, repeat) sampling seed."""
        ...

    def prompt_text(self, request: Request) -> str:
        """The text whose sha256 is the record's prompt hash (lm-eval: the context string)."""
        ...

    def score(self, item: Item, result: Result) -> Scored:
        """Score one finished sample (the result is never a Failure: the runner handles those)."""
        ...


# Optional capabilities: a task has them when it defines the member (checked with isinstance).


@runtime_checkable
class RepeatScored(Protocol):
    """A task whose prompt depends on the repeat (GPQA model-card style: choices shuffled per repeat): the
    runner calls `score_repeat` instead of `score`."""

    def score_repeat(self, item: Item, result: Result, repeat: int) -> Scored:
        """Score one finished sample of repeat `repeat`."""
        ...


@runtime_checkable
class WithReference(Protocol):
    """A task with a reference answer (GSM8K's worked solution, the gold choice, MATH-500's solution, the
    needle's value): the continuation teacher-forced after the prompt the task sends for the item (the
    generation prompt or the log-likelihood context, rendered as it is sent), written as a log-likelihood
    continuation is (target delimiter included). The runner stores the result in
    SampleRecord.reference_logprobs (token ids and log-probs only, never the text: GPQA's stays unseen)."""

    def reference(self, item: Item) -> str | None:
        """The item's reference continuation (None or "": the item has none)."""
        ...


@runtime_checkable
class WithReferenceContext(Protocol):
    """A task whose reference follows another context than the request's prompt (WinoGrande: the gold
    option's context)."""

    def reference_context(self, item: Item, request: Request) -> str:
        """The prompt the item's reference follows."""
        ...


@runtime_checkable
class ServedInSessions(Protocol):
    """A task served as sessions along cache paths (the sessions probe): its requests reach the engine in its
    own order, one call per step, so evals.run.sessions runs it, not the chunked runner."""

    def session_context(self, item: Item) -> str:
        """The context the turns of the item's session share."""
        ...

    def path_names(self) -> list[str]:
        """The cache paths every turn is served on."""
        ...
