"""evals.tasks (the registry in evals/tasks/__init__.py): every task builds and is versioned,
names its datasets, and an unknown name suggests the closest."""

from __future__ import annotations

import importlib.util

import pytest

from evals.data import DATASETS
from evals.errors import EvalError
from evals.tasks import TASK_DATASETS, TASKS, get_task, task_datasets
from evals.tasks.base import Task

OURS = [n for n in TASKS if n not in ("wikitext_kl", "needle", "sessions", "agentic", "agentic_bfcl", "ruler")]


@pytest.mark.parametrize("name", OURS)
def test_every_task_builds_and_is_versioned(name: str) -> None:
    task = get_task(name)
    assert isinstance(task, Task)
    assert task.name == name
    assert "+lm-eval-" in task.version or task.version.endswith("+simple-evals")  # the reference it follows


def test_every_task_names_its_datasets() -> None:
    assert set(TASK_DATASETS) == set(TASKS)
    assert all(d in DATASETS for ds in TASK_DATASETS.values() for d in ds)


def test_task_names_map_to_their_datasets() -> None:
    assert task_datasets(["gpqa_main_cot_zeroshot", "gpqa_main_zeroshot", "truthfulqa_mc2", "sessions"]) == [
        "gpqa_main",
        "truthfulqa_mc",
        "gsm8k",
    ]
    assert task_datasets(["needle"]) == []  # generated in memory: no dataset
    with pytest.raises(EvalError, match="unknown task 'gpqa_main'; did you mean"):
        task_datasets(["gpqa_main"])  # a dataset, not a task


def test_unknown_task_suggests_closest() -> None:
    with pytest.raises(EvalError, match="did you mean 'gsm8k'"):
        get_task("gsm8kk")


def test_reserved_probe_names_point_at_their_modules() -> None:
    assert TASKS["wikitext_kl"] == "evals.tasks.wikitext_kl" and TASKS["needle"] == "evals.tasks.needle"
    for name in ("wikitext_kl", "needle"):
        if importlib.util.find_spec(TASKS[name]) is None:
            with pytest.raises(EvalError, match="not available"):
                get_task(name)


def test_which_tasks_chat() -> None:
    from evals.tasks import supports_chat

    assert supports_chat("gsm8k_cot_llama") and supports_chat("arc_challenge") and supports_chat("winogrande")
    assert not supports_chat("wikitext_kl") and not supports_chat("needle")
    with pytest.raises(EvalError, match="did you mean"):
        supports_chat("gsm8k_cot_lama")
