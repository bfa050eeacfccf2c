"""TruthfulQA MC1 / MC2: by hand and against lm-eval's own process_results_mc2."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import lm_eval
import pytest

from evals.engines.base import LoglikelihoodResult
from evals.tasks import get_task, truthfulqa
from evals.tasks.base import Item


def ll(*values: float) -> LoglikelihoodResult:
    return LoglikelihoodResult(loglikelihoods=values, is_greedy=(False,) * len(values))


def _lm_eval_truthfulqa_utils():  # lm-eval's own utils module, loaded from its file
    path = Path(lm_eval.__file__).parent / "tasks/truthfulqa/utils.py"
    spec = importlib.util.spec_from_file_location("lm_eval_truthfulqa_utils", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_mc2_by_hand_and_against_lm_eval() -> None:
    doc = {"mc2_targets": {"choices": ["a", "b", "c"], "labels": [1, 1, 0]}}
    lls = [math.log(0.2), math.log(0.3), math.log(0.5)]
    assert truthfulqa.mc2_score(doc, lls, ["a", "b", "c"])["acc,none"] == pytest.approx(0.5, abs=1e-12)
    doc2 = {"mc2_targets": {"choices": ["a", "b", "c", "d"], "labels": [0, 1, 0, 1]}}  # labels not sorted
    lls2 = [-2.0, -1.0, -0.5, -3.0]
    theirs = _lm_eval_truthfulqa_utils().process_results_mc2(doc2, [(x, False) for x in lls2])["acc"]
    assert truthfulqa.mc2_score(doc2, lls2, ["a", "b", "c", "d"])["acc,none"] == pytest.approx(
        theirs, abs=1e-15
    )


def test_mc1_gold_is_first_choice() -> None:
    task = get_task("truthfulqa_mc1")
    doc = {
        "id": "0",
        "question": "q?",
        "mc1_targets": {"choices": ["t", "f1", "f2"], "labels": [1, 0, 0]},
        "mc2_targets": {"choices": ["t"], "labels": [1]},
    }
    assert task.score(Item("0", doc), ll(-1.0, -2.0, -3.0)).scores == {"acc,none": 1.0}
    assert task.score(Item("0", doc), ll(-2.0, -1.0, -3.0)).scores == {"acc,none": 0.0}
    req = task.request(Item("0", doc), repeat=0, seed=0)
    assert req.context == truthfulqa.QA_PRIMER + "\n\nQ: q?\nA:"
    assert req.prefix == truthfulqa.QA_PRIMER + "\n\nQ: "  # the primer is shared by every item
