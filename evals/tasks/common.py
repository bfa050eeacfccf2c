"""What every lm-eval-compatible task shares: lm-eval's prompt assembly, its few-shot sampler, the
multiple-choice metrics, and option checks.

lm-eval (v0.4, `ConfigurableTask.fewshot_context` without a chat template) renders a context as
`description + sum(q_i + target_delimiter + a_i + fewshot_delimiter) + q`; a multiple-choice request
scores `target_delimiter + choice` given that context. These helpers reproduce exactly that, and
tests/evals/test_task_prompts.py checks the bytes against lm-eval's own task objects.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from evals.errors import EvalError
from evals.tasks.base import TaskOptions

TARGET_DELIMITER = " "  # lm_eval.config.task.TaskConfig default
FEWSHOT_DELIMITER = "\n\n"  # lm_eval.config.task.TaskConfig default
FEWSHOT_SEED = 1234  # lm_eval.defaults.DEFAULT_OTHER_SEED: simple_evaluate's fewshot_random_seed
RANDOM_SEED = 0  # lm_eval.defaults.DEFAULT_RANDOM_SEED: simple_evaluate seeds python `random` with it
FEWSHOT_KEY = "_fewshot"  # Item.doc key holding the rendered description + few-shot block
LM_EVAL_MAX_GEN_TOKS = 256  # lm_eval.api.model default max_gen_toks when a task sets none


def fewshot_block(description: str, shots: Sequence[tuple[str, str]]) -> str:
    """description + each (question, answer) shot as q + " " + a + "\\n\\n" (lm-eval's plain rendering)."""
    return description + "".join(q + TARGET_DELIMITER + a + FEWSHOT_DELIMITER for q, a in shots)


def sequential_fewshot_indices(
    pool_size: int, n_items: int, k: int, seed: int = FEWSHOT_SEED
) -> list[list[int]]:
    """Pool indices of the k shots for each of n_items documents, as lm-eval's default sampler draws
    them: one `random.Random(seed)` shared by the whole run, `rnd.sample(pool, k)` per document in
    document order (the pool is a different split, so nothing is excluded)."""
    rnd = random.Random(seed)
    population = range(pool_size)
    return [rnd.sample(population, k) for _ in range(n_items)]


def mc_scores(
    loglikelihoods: Sequence[float],
    gold: int,
    choices: Sequence[str],
    metrics: Sequence[str] = ("acc", "acc_norm"),
) -> dict[str, float | None]:
    """lm-eval multiple-choice metrics: acc = argmax ll is gold; acc_norm = argmax ll / len(choice chars)."""
    lls = np.asarray(loglikelihoods, dtype=np.float64)
    if lls.shape != (len(choices),):
        raise EvalError(f"got {lls.size} log-likelihoods for {len(choices)} choices")
    completion_len = np.array([float(len(c)) for c in choices])
    values = {
        "acc": 1.0 if int(np.argmax(lls)) == gold else 0.0,
        "acc_norm": 1.0 if int(np.argmax(lls / completion_len)) == gold else 0.0,
    }
    return {f"{m},none": values[m] for m in metrics}


def resolve_fewshot(task: str, options: TaskOptions, default: int, pool: str | None) -> int:
    """The number of shots: the option, else lm-eval's default; a task without a local few-shot pool
    (or zero-shot by definition, where lm-eval ignores the override) refuses k > 0."""
    k = default if options.num_fewshot is None else options.num_fewshot
    if k < 0:
        raise EvalError(f"{task}: num_fewshot {k} is negative")
    if k > 0 and pool is None:
        raise EvalError(
            f"{task}: num_fewshot {k} is not supported (the task is zero-shot in lm-eval, or the local "
            "data has no few-shot split); use num_fewshot = 0"
        )
    return k


def task_version(ours: int, lm_eval_version: str) -> str:
    """Record task version: this toolkit's revision of the task plus the lm-eval YAML version it follows."""
    return f"{ours}+lm-eval-{lm_eval_version}"


def with_fewshot(doc: Mapping[str, Any], block: str) -> dict[str, Any]:
    """A copy of `doc` carrying the rendered description + few-shot block under FEWSHOT_KEY."""
    return {**doc, FEWSHOT_KEY: block}
