"""WinoGrande partial scoring: one context per option, the text after the blank scored given each."""

from __future__ import annotations

from evals.engines.base import LoglikelihoodRequest, LoglikelihoodResult
from evals.tasks import get_task, winogrande
from evals.tasks.base import Item

DOC = {"sentence": "Ann beat Bob so _ won the cup.", "option1": "Ann", "option2": "Bob", "answer": "1"}


def ll(*values: float) -> LoglikelihoodResult:
    return LoglikelihoodResult(loglikelihoods=values, is_greedy=(False,) * len(values))


def test_partial_scoring() -> None:
    assert winogrande.partial_pairs(DOC) == [
        ("Ann beat Bob so Ann", " won the cup."),
        ("Ann beat Bob so Bob", " won the cup."),
    ]
    task = get_task("winogrande")
    scored = task.score(Item("0", DOC), ll(-2.0, -5.0))
    assert (
        scored.scores == {"acc,none": 1.0}
        and scored.extracted == {"none": "0"}
        and scored.target == "won the cup."
    )
    assert task.score(Item("0", {**DOC, "answer": "2"}), ll(-2.0, -5.0)).scores == {"acc,none": 0.0}


def test_request_pairs_each_continuation_with_its_context() -> None:
    req = get_task("winogrande").request(Item("0", DOC), repeat=0, seed=0)
    assert isinstance(req, LoglikelihoodRequest)
    assert req.pairs() == winogrande.partial_pairs(DOC) and req.context == "Ann beat Bob so Ann"
