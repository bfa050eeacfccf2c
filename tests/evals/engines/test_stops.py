"""cut_at_stop: lm-eval's `until` cut (the earliest occurrence of any stop string), checked against
lm-eval's own postprocess_generated_text."""

from __future__ import annotations

import pytest

from evals.engines.stops import cut_at_stop

CASES = [
    ("5\n\nQuestion: next", ["\n\n", "Question:"], "5"),
    ("5 Question: next\n\n", ["\n\n", "Question:"], "5 "),  # the earliest wins, not the first listed
    ("no stop here", ["\n\n"], "no stop here"),
    ("abc", [], "abc"),
    ("abc", ["", "c"], "ab"),  # an empty stop string is ignored
    ("stop at start", ["stop"], ""),
    ("", ["x"], ""),
    ("aXbYc", ["Y", "X"], "a"),
]


@pytest.mark.parametrize(("text", "until", "want"), CASES)
def test_cut_at_stop(text: str, until: list[str], want: str) -> None:
    assert cut_at_stop(text, until) == want
    assert cut_at_stop(text, tuple(until)) == want


@pytest.mark.parametrize(("text", "until", "want"), CASES)
def test_cut_at_stop_equals_lm_eval(text: str, until: list[str], want: str) -> None:
    from lm_eval.models.utils import postprocess_generated_text

    assert cut_at_stop(text, until) == postprocess_generated_text(text, until, None)
