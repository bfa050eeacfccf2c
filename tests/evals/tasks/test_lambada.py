"""LAMBADA: the last word (with its space) is the continuation; acc is the greedy match."""

from __future__ import annotations

from evals.engines.base import LoglikelihoodResult
from evals.tasks import get_task
from evals.tasks.base import Item


def test_request_and_scores() -> None:
    task = get_task("lambada_openai")
    doc = {"id": "0", "text": "he opened the door and saw the \n\nrecorder"}
    req = task.request(Item("0", doc), repeat=0, seed=0)
    assert req.context == "he opened the door and saw the" and req.continuations == (" \n\nrecorder",)
    scored = task.score(Item("0", doc), LoglikelihoodResult(loglikelihoods=(-1.5,), is_greedy=(True,)))
    assert scored.scores == {"acc,none": 1.0, "loglikelihood,none": -1.5}
