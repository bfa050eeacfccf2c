"""What every lm-eval-compatible task shares: lm-eval's prompt assembly, its few-shot sampler, the
multiple-choice metrics, and option checks.

lm-eval (v0.4, `ConfigurableTask.fewshot_context` without a chat template) renders a context as
`description + sum(q_i + target_delimiter + a_i + fewshot_delimiter) + q`; a multiple-choice request
scores `target_delimiter + choice` given that context. These helpers reproduce exactly that, and
tests/evals/tasks/test_prompts.py checks the bytes against lm-eval's own task objects.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from evals.data import Row
from evals.engines.base import GenerateRequest, LoglikelihoodRequest
from evals.errors import EvalError
from evals.tasks.base import Item, Request, Scored, TaskOptions

TARGET_DELIMITER = " "  # lm_eval.config.task.TaskConfig default
FEWSHOT_DELIMITER = "\n\n"  # lm_eval.config.task.TaskConfig default
FEWSHOT_SEED = 1234  # lm_eval.defaults.DEFAULT_OTHER_SEED: simple_evaluate's fewshot_random_seed
RANDOM_SEED = 0  # lm_eval.defaults.DEFAULT_RANDOM_SEED: simple_evaluate seeds python `random` with it
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


def row_items(rows: Sequence[Row]) -> list[Item]:
    """One zero-shot Item per row, id = the row's "id"."""
    return [Item(item_id=doc["id"], doc=doc) for doc in rows]


def generate_request(
    prompt: str,
    until: tuple[str, ...],
    max_tokens: int,
    temperature: float,
    seed: int,
    prefix: str | None = None,
) -> GenerateRequest:
    """A generation request; the per-sample seed is passed on only when sampling (temperature > 0)."""
    return GenerateRequest(
        prompt=prompt,
        until=until,
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed if temperature > 0 else None,
        prefix=prefix,
    )


def generate_prompt(request: Request) -> str:
    """A generation request's full prompt (lm-eval's prompt hash input)."""
    assert isinstance(request, GenerateRequest)
    return request.prompt


def loglikelihood_context(request: Request) -> str:
    """A log-likelihood request's context string (lm-eval's prompt hash input)."""
    assert isinstance(request, LoglikelihoodRequest)
    return request.context


def exact_match_scored(
    extracted: Mapping[str, str], target: str, match: Callable[[str, str], float]
) -> Scored:
    """Scored with "exact_match,<filter>" = match(answer, target) for each filter's extracted answer."""
    scores: dict[str, float | None] = {f"exact_match,{k}": match(v, target) for k, v in extracted.items()}
    return Scored(scores=scores, extracted=dict(extracted), target=target)


def probe_extra(task: str, options: TaskOptions, known: Sequence[str], no_fewshot: str) -> Mapping[str, Any]:
    """A probe's `options.extra`, refusing unknown keys and any num_fewshot (`no_fewshot` says why)."""
    unknown = sorted(set(options.extra) - set(known))
    if unknown:
        raise EvalError(f"{task}: unknown option(s) {unknown}; known: {', '.join(known)}")
    if options.num_fewshot:
        raise EvalError(f"{task}: num_fewshot does not apply ({no_fewshot}); leave it unset")
    return options.extra


def int_option(task: str, extra: Mapping[str, Any], key: str, default: int, low: int) -> int:
    """The integer option `key` (default when absent); EvalError unless it is an int >= low."""
    value = extra.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise EvalError(f"{task}: option {key} must be an integer >= {low}, got {value!r}")
    return value
