"""lm-eval's `exact_match` metric, the one every task here scores an extracted answer with.

lm-eval computes it with `exact_match_hf_evaluate`, configured per task by the metric_list of the task's
YAML (what to ignore before comparing); `Normalisation` is that configuration, and each task names its
own (gsm8k's: case, ",", "$", everything up to "#### " and a trailing "."; gpqa's: case and punctuation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lm_eval.api.metrics import exact_match_hf_evaluate

from evals.tasks.base import Scored


@dataclass(frozen=True)
class Normalisation:
    """What exact_match ignores in both strings before comparing them (a YAML metric_list entry's kwargs)."""

    ignore_case: bool = False
    ignore_punctuation: bool = False
    ignore_numbers: bool = False
    regexes_to_ignore: tuple[str, ...] = ()  # removed in order, each with re.sub


def exact_match(extracted: str, target: str, normalisation: Normalisation) -> float:
    """lm-eval's exact_match of one answer under `normalisation`, 1.0 or 0.0."""
    result = exact_match_hf_evaluate(
        predictions=[extracted], references=[target],
        regexes_to_ignore=list(normalisation.regexes_to_ignore) or None,  # None, as lm-eval passes when unset
        ignore_case=normalisation.ignore_case, ignore_punctuation=normalisation.ignore_punctuation,
        ignore_numbers=normalisation.ignore_numbers)
    return float(result["exact_match"])


def exact_match_scored(extracted: Mapping[str, str], target: str, normalisation: Normalisation) -> Scored:
    """Scored with "exact_match,<filter>" = exact_match(answer, target) for each filter's extracted answer."""
    scores: dict[str, float | None] = {f"exact_match,{k}": exact_match(v, target, normalisation)
                                       for k, v in extracted.items()}
    return Scored(scores=scores, extracted=dict(extracted), target=target)
