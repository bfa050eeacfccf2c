"""LAMBADA (OpenAI detokenised test set), as lm-eval's `lambada_openai` (lm_eval/tasks/lambada,
version 1.0).

Paperno et al. 2016, "The LAMBADA dataset: Word prediction requiring a broad discourse context",
arXiv:1606.06031.

Context: the passage up to its last space-separated word; continuation: " " + that word.
acc = the continuation is the greedy decode (lm-eval's `is_greedy`). lm-eval also logs the
continuation's log-likelihood per sample under the name "perplexity" (its aggregation is
exp(-mean)); it is recorded here as "loglikelihood,none" so that a mean over items means what it
says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evals import data
from evals.data import Row
from evals.engines.base import LoglikelihoodRequest, LoglikelihoodResult
from evals.prompts.chat import ChatRenderer, ChatTemplate
from evals.tasks.base import Item, Request, Result, Scored, TaskKind, TaskOptions
from evals.tasks.common import (
    loglikelihood_context,
    rendered_context,
    row_items,
    task_version,
    zero_shot_chat,
)


def doc_to_text(doc: Row) -> str:
    """lm-eval: "{{text.split(' ')[:-1]|join(' ')}}"."""
    return " ".join(doc["text"].split(" ")[:-1])


def doc_to_target(doc: Row) -> str:
    """lm-eval: "{{' '+text.split(' ')[-1]}}"."""
    return " " + doc["text"].split(" ")[-1]


@dataclass(frozen=True)
class LambadaTask:
    """Last-word prediction scored by log-likelihood and greedy match."""

    chat: ChatRenderer | None = None
    name: str = "lambada_openai"
    version: str = task_version(1, "1.0")
    kind: TaskKind = "loglikelihood"

    def items(self, data_dir: Path | None) -> list[Item]:
        """The 5153 test passages in file order."""
        return row_items(data.load("lambada_openai", data_dir))

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """One continuation: the last word with its leading space (lm-eval keeps it under chat too: a
        `loglikelihood` task's continuation is its target as is)."""
        context, prefix = rendered_context(self.chat, doc_to_text(item.doc))
        return LoglikelihoodRequest(context=context, continuations=(doc_to_target(item.doc),), prefix=prefix)

    def prompt_text(self, request: Request) -> str:
        """lm-eval's prompt hash input: the context string."""
        return loglikelihood_context(request)

    def reference(self, item: Item) -> str:
        """The last word with its leading space: the request's own continuation."""
        return doc_to_target(item.doc)

    def score(self, item: Item, result: Result) -> Scored:
        """acc (greedy match) and the continuation's log-likelihood (nats)."""
        assert isinstance(result, LoglikelihoodResult)
        (ll,), (greedy,) = result.loglikelihoods, result.is_greedy
        scores: dict[str, float | None] = {
            "acc,none": 1.0 if greedy else 0.0,
            "loglikelihood,none": float(ll),
        }
        return Scored(scores=scores, extracted={}, target=doc_to_target(item.doc))


def build(name: str, options: TaskOptions, template: ChatTemplate | None = None) -> LambadaTask:
    """LAMBADA (zero-shot only: the local data has no few-shot split)."""
    return LambadaTask(chat=zero_shot_chat(name, options, template, generates=False))
