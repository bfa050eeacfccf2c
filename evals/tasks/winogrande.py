"""WinoGrande (winogrande_1.1 dev), as lm-eval's `winogrande` task (lm_eval/tasks/winogrande,
version 1.0): partial evaluation.

Sakaguchi et al. 2019, "WinoGrande: An Adversarial Winograd Schema Challenge at Scale",
arXiv:1907.10641; partial scoring after Trinh & Le 2018, arXiv:1806.02847.

lm-eval fills the blank with each option to make one *context* per option
(sentence[:blank] + option) and scores the same *continuation* (" " + the text after the blank)
given each: lm-eval's requests are [(context_1, " " + rest), (context_2, " " + rest)], acc = the
option whose context gives the rest the higher log-likelihood is the answer. The option's own tokens
are never scored, which is the point of partial evaluation.

Expressed with `LoglikelihoodRequest` as: `contexts` = the per-option contexts, `continuations` =
the shared continuation once per option (continuation i is scored given contexts[i]); `context` is
the first option's context, which is also lm-eval's prompt hash input (arguments[0] of the first
request). Engines score such a request through `LoglikelihoodRequest.pairs()`, which pairs each
continuation with its own context.
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
    TARGET_DELIMITER,
    loglikelihood_context,
    mc_scores,
    reference_continuation,
    rendered_context,
    row_items,
    task_version,
    zero_shot_chat,
)


def doc_to_choice(doc: Row) -> list[str]:
    """lm-eval preprocess_winogrande.doc_to_choice: the sentence up to the blank + each option."""
    idx = doc["sentence"].index("_")
    return [doc["sentence"][:idx] + opt for opt in (doc["option1"], doc["option2"])]


def doc_to_target(doc: Row) -> str:
    """lm-eval preprocess_winogrande.doc_to_target: the text after the blank, stripped."""
    idx = doc["sentence"].index("_") + 1
    return doc["sentence"][idx:].strip()


def gold(doc: Row) -> int:
    """lm-eval preprocess_winogrande.doc_to_text: answer "1"/"2" -> 0/1 (the gold context)."""
    return {"1": 0, "2": 1}[doc["answer"]]


def partial_pairs(doc: Row) -> list[tuple[str, str]]:
    """lm-eval's (context, continuation) log-likelihood requests for one document, in option order."""
    continuation = TARGET_DELIMITER + doc_to_target(doc)
    return [(context, continuation) for context in doc_to_choice(doc)]


@dataclass(frozen=True)
class WinograndeTask:
    """Two contexts, one continuation; acc = the gold option's context scores the rest higher."""

    chat: ChatRenderer | None = None
    name: str = "winogrande"
    version: str = task_version(1, "1.0")
    kind: TaskKind = "loglikelihood"

    def items(self, data_dir: Path | None) -> list[Item]:
        """The 1267 dev sentences in file order."""
        return row_items(data.load("winogrande", data_dir))

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """One request holding both (context, continuation) pairs (see the module docstring)."""
        if self.chat is not None:  # lm-eval multiple_input_context: each context rendered, a bare continuation
            rendered = [rendered_context(self.chat, ctx) for ctx in doc_to_choice(item.doc)]
            return LoglikelihoodRequest(context=rendered[0][0], continuations=(doc_to_target(item.doc),) * len(rendered),
                                        contexts=tuple(c for c, _ in rendered), prefix=rendered[0][1])
        pairs = partial_pairs(item.doc)
        return LoglikelihoodRequest(context=pairs[0][0], continuations=tuple(c for _, c in pairs),
                                    contexts=tuple(ctx for ctx, _ in pairs))

    def prompt_text(self, request: Request) -> str:
        """lm-eval's prompt hash input: the first option's context."""
        return loglikelihood_context(request)

    def reference(self, item: Item) -> str:
        """The text after the blank as lm-eval's partial evaluation scores it (given the gold context)."""
        return reference_continuation(doc_to_target(item.doc), self.chat is not None)

    def reference_context(self, item: Item, request: Request) -> str:
        """The gold option's context, as the request sends it (rendered under chat)."""
        assert isinstance(request, LoglikelihoodRequest)
        return request.contexts[gold(item.doc)]

    def score(self, item: Item, result: Result) -> Scored:
        """acc: the gold option's context gives the continuation the higher log-likelihood."""
        assert isinstance(result, LoglikelihoodResult)
        scores = mc_scores(result.loglikelihoods, gold(item.doc), doc_to_choice(item.doc), ("acc",))
        pred = 0 if result.loglikelihoods[0] >= result.loglikelihoods[1] else 1
        return Scored(scores=scores, extracted={"none": str(pred)}, target=doc_to_target(item.doc))


def build(name: str, options: TaskOptions, template: ChatTemplate | None = None) -> WinograndeTask:
    """WinoGrande (zero-shot only: the local data has no training split for shots)."""
    return WinograndeTask(chat=zero_shot_chat(name, options, template, generates=False))
