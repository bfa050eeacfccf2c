"""What the two session tasks (`sessions`, `agentic`) share: a turn, the prompts a session's turns get, and
the task methods that read a turn's item.

Turn k's prompt is the session's context, every earlier turn's question + " " + REFERENCE answer (+ what
followed it: a tool result) + "\\n\\n", then turn k's question: fixed text, the same in every arm and on every
cache path, each prompt extending the one before. Each item's doc holds its turn's "prompt", "answer" and
"context_chars" (the length of the context it starts with); `SessionTurns` reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from evals.engines.base import TokenLogprobsRequest
from evals.tasks.base import Item, Request
from evals.tasks.common import FEWSHOT_DELIMITER, TARGET_DELIMITER, generate_prompt
from evals.tasks.tool_catalog import ToolTurn

Kind = Literal["tool", "lookup", "gsm8k"]
KINDS: tuple[str, ...] = get_args(Kind)
TURN_END = FEWSHOT_DELIMITER  # "\n\n" after each earlier turn, as lm-eval ends a shot
REFERENCE_TOP_K = 20  # alternatives kept per teacher-forced position (as wikitext_kl and the reference signal)
REFERENCE_MAX_TOKENS = 512  # reference tokens scored per turn (GSM8K's longest solutions fit)


@dataclass(frozen=True)
class Turn:
    """One turn: its question (prompt text), reference answer, what follows the answer (a tool result; "" for
    none) and where it comes from (a function name or BFCL entry, a fact key, a GSM8K test row id)."""

    kind: Kind
    question: str
    answer: str
    after: str = ""
    source: str = ""
    tool: ToolTurn | None = None


def history_text(turn: Turn) -> str:
    """A turn as later prompts hold it: question, reference answer, what followed it."""
    return turn.question + TARGET_DELIMITER + turn.answer + turn.after + TURN_END


def turn_prompts(context: str, turns: Sequence[Turn]) -> list[str]:
    """Each turn's prompt: the context, every earlier turn with its reference answer and result, its question."""
    prompts, history = [], context
    for turn in turns:
        prompts.append(history + turn.question)
        history += history_text(turn)
    return prompts


class SessionTurns:
    """The methods of a session task that read only a turn's item (its doc's prompt, answer, context_chars).
    A mixin, not a base class: each task is a frozen dataclass of its own and defines everything else."""

    def session_context(self, item: Item) -> str:
        """The shared context every turn of the item's session starts with."""
        return item.doc["prompt"][: item.doc["context_chars"]]

    def prompt_text(self, request: Request) -> str:
        """The whole prompt of the turn."""
        return generate_prompt(request)

    def reference(self, item: Item) -> str:
        """The turn's reference answer (doc "answer") as the continuation of its prompt (what the next turn's
        prompt holds)."""
        return TARGET_DELIMITER + item.doc["answer"]

    def reference_request(self, item: Item) -> TokenLogprobsRequest:
        """The teacher-forced pass over the turn's reference answer given its prompt (doc "prompt")."""
        return TokenLogprobsRequest(text=self.reference(item), top_k=REFERENCE_TOP_K,
                                    max_tokens=REFERENCE_MAX_TOKENS, context=item.doc["prompt"])
