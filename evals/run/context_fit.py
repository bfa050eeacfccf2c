"""Whether every item of a task fits a model's context window, checked on the tokenizer alone before any arm
starts: an engine left-truncates a prompt that does not fit (lm-eval's rule, evals.engines.hf), so a RULER
haystack past the window would silently lose its needles and still be scored. Such a task (WHOLE_CONTEXT) is
refused, and so is a session task (below); for the others the overflow is a warning.

An item needs its prompt's tokens plus its generation budget (a generate request), or its context and its
longest continuation (a log-likelihood request). A teacher-forced pass (token_logprobs) is capped at the
window by the task itself and is not checked. A session task (sessions, agentic, agentic_bfcl: each turn's
prompt holds every turn before it) needs, per session, what the session runner checks when the arm starts
(evals.run.sessions.check_fits): its longest turn's prompt with that turn's reference answer, plus the task's
largest generation budget; one session past the window refuses the task, here before any arm starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from evals.engines.base import GenerateRequest, LoglikelihoodRequest
from evals.errors import EvalError
from evals.run.resume import build_samples
from evals.tasks.base import Item, ServedInSessions, Task

Encode = Callable[[str], list[int]]
# Tasks whose items are built to a context length (a haystack with what is retrieved from it): a prompt cut to the
# window is no longer the item, so one that does not fit is refused. Every other task is lm-eval's or built like
# one, and its engines cut an overlong prompt's head as lm-eval does: a warning, not a refusal.
WHOLE_CONTEXT = frozenset({"ruler", "needle"})
SESSION_LENGTH_OPTIONS = {"agentic": "session_tokens", "agentic_bfcl": "session_tokens"}  # else context_tokens


@runtime_checkable
class SessionSized(Protocol):
    """What a session task says about a turn's size: its reference answer and the largest generation budget."""

    @property
    def max_new_tokens(self) -> int: ...

    def reference(self, item: Item) -> str: ...


@dataclass(frozen=True)
class Overflow:
    """The first item of a task that does not fit, and how many do not (of `unit`: items, or sessions)."""

    item_id: str
    need: int
    what: str  # how `need` is made up
    count: int
    total: int
    unit: str = "items"


def item_need(request: object, encode: Encode) -> tuple[int, str] | None:
    """Tokens one request needs in the window and what they are; None for a request that is not checked."""
    if isinstance(request, GenerateRequest):
        prompt = len(encode(request.prompt))
        return prompt + request.max_tokens, f"prompt {prompt} + max_tokens {request.max_tokens}"
    if isinstance(request, LoglikelihoodRequest):
        longest = max((len(encode(c + x)) for c, x in request.pairs()), default=0)
        return longest, "context + longest continuation"
    return None


def longest_turns(items: Sequence[Item]) -> list[Item]:
    """The turn with the longest prompt of each session among `items`, in session order (a turn's prompt holds
    every turn before it, so this is the session's last turn)."""
    longest: dict[str, Item] = {}
    for item in items:
        held = longest.get(item.doc["session"])
        if held is None or len(item.doc["prompt"]) > len(held.doc["prompt"]):
            longest[item.doc["session"]] = item
    return list(longest.values())


def session_overflow(task: SessionSized, items: Sequence[Item], encode: Encode, window: int) -> Overflow | None:
    """The first session of `items` whose longest turn (prompt + reference answer, plus the task's largest
    generation budget) needs more than `window` tokens; None if every session fits."""
    first: tuple[str, int, str] | None = None
    turns = longest_turns(items)
    count = 0
    for turn in turns:
        held = len(encode(turn.doc["prompt"] + task.reference(turn)))
        need = held + task.max_new_tokens
        if need > window:
            count += 1
            what = f"last turn's prompt and reference {held} + max_tokens {task.max_new_tokens}"
            first = first or (turn.item_id, need, what)
    return None if first is None else Overflow(*first, count, len(turns), "sessions")


def first_overflow(task: Task, items: Sequence[Item], seed: int, encode: Encode, window: int) -> Overflow | None:
    """The first item of `items` (the task's selection) that needs more than `window` tokens, or for a session
    task the first session; None if all fit."""
    if isinstance(task, ServedInSessions):
        assert isinstance(task, SessionSized), f"session task {task.name} says no turn size"
        return session_overflow(task, items, encode, window)
    first: tuple[str, int, str] | None = None
    count = 0
    for sample in build_samples(task, items, 1, seed):
        need = item_need(sample.request, encode) if sample.request is not None else None
        if need is not None and need[0] > window:
            count += 1
            first = first or (sample.item.item_id, *need)
    return None if first is None else Overflow(first[0], first[1], first[2], count, len(items))


def check_fit(task: Task, items: Sequence[Item], seed: int, encode: Encode, window: int, where: str) -> str | None:
    """The first item of the task that does not fit `window` tokens of `where`: an EvalError (one line) for a
    task built to a context length (WHOLE_CONTEXT) or a session task, else a warning line (None when every item
    fits)."""
    over = first_overflow(task, items, seed, encode, window)
    if over is None:
        return None
    what = (f"task {task.name}: item {over.item_id!r} needs {over.need} tokens ({over.what}), more than the "
            f"{window}-token context window of {where}; {over.count} of {over.total} {over.unit} do not fit")
    if over.unit == "sessions":
        length = SESSION_LENGTH_OPTIONS.get(task.name, "context_tokens")
        raise EvalError(f"{what}: lower its {length}, turns or max_tokens (a turn past the window cannot be served "
                        "whole, and the session runner refuses it when the arm starts)")
    if task.name in WHOLE_CONTEXT:
        raise EvalError(f"{what}: lower its lengths option (an engine would cut the prompt's head, and with it what "
                        "is retrieved)")
    return f"{what}: the engine cuts their prompts' heads as lm-eval does; lower max_tokens or num_fewshot to keep them"
