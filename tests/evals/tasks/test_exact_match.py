"""The one exact_match: each task's Normalisation is its lm-eval YAML's metric_list entry, and a score is
what lm-eval's own metric, configured by that YAML, gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lm_eval
import pytest
from lm_eval.api.metrics import exact_match_hf_evaluate
from lm_eval.tasks._yaml_loader import load_yaml

from evals.tasks import gpqa, gsm8k
from evals.tasks.exact_match import Normalisation, exact_match, exact_match_scored

LM_TASKS = Path(lm_eval.__file__).parent / "tasks"
METRIC_KEYS = ("regexes_to_ignore", "ignore_case", "ignore_punctuation", "ignore_numbers")
YAMLS = {
    "gsm8k/gsm8k.yaml": gsm8k.NORMALISATION,
    "gsm8k/gsm8k-cot-llama.yaml": gsm8k.NORMALISATION,
    "gsm8k/gsm8k-cot-zeroshot.yaml": gsm8k.NORMALISATION,
    "gpqa/cot_zeroshot/_gpqa_cot_zeroshot_yaml": gpqa.NORMALISATION,
}
PAIRS = [("$1,234", "blah #### 1234"), ("1234.", "#### 1234"), ("(B)", "(b)"), ("(B)", "B"), ("12", "#### 1234"),
         ("The Answer", "the answer!"), ("", ""), ("7", "#### 7\n")]


def yaml_kwargs(rel: str) -> dict[str, Any]:
    """The exact_match entry of a task YAML's metric_list, less what is not the metric's own argument."""
    cfg = load_yaml(LM_TASKS / rel, resolve_func=False)
    entry = next(m for m in cfg["metric_list"] if m["metric"] == "exact_match")
    return {k: v for k, v in entry.items() if k in METRIC_KEYS}


@pytest.mark.parametrize("rel", sorted(YAMLS))
def test_each_normalisation_is_its_yamls(rel: str) -> None:
    kwargs = yaml_kwargs(rel)
    ours = YAMLS[rel]
    assert ours == Normalisation(**{**kwargs, "regexes_to_ignore": tuple(kwargs.get("regexes_to_ignore", ()))})


@pytest.mark.parametrize("rel", sorted(YAMLS))
def test_scores_are_lm_evals_own(rel: str) -> None:
    kwargs = yaml_kwargs(rel)
    for extracted, target in PAIRS:
        theirs = float(exact_match_hf_evaluate(predictions=[extracted], references=[target], **kwargs)["exact_match"])
        assert exact_match(extracted, target, YAMLS[rel]) == theirs, (extracted, target)


def test_the_two_normalisations_differ_where_they_should() -> None:
    assert exact_match("(B)", "B", gpqa.NORMALISATION) == 1.0  # gpqa drops punctuation
    assert exact_match("(B)", "B", gsm8k.NORMALISATION) == 0.0  # gsm8k keeps it
    assert exact_match("7", "work #### 7", gsm8k.NORMALISATION) == 1.0  # gsm8k drops up to "#### "
    assert exact_match("7", "work #### 7", gpqa.NORMALISATION) == 0.0
    assert exact_match("x", "X", Normalisation()) == 0.0  # nothing ignored: case counts


def test_scored_keys_every_filter() -> None:
    scored = exact_match_scored({"strict-match": "18", "flexible-extract": "[invalid]"}, "#### 18", gsm8k.NORMALISATION)
    assert scored.scores == {"exact_match,strict-match": 1.0, "exact_match,flexible-extract": 0.0}
    assert scored.extracted == {"strict-match": "18", "flexible-extract": "[invalid]"} and scored.target == "#### 18"
