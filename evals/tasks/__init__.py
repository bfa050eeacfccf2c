"""Tasks by name. Each module exposes `build(name: str, options: TaskOptions, template: ChatTemplate | None)
-> Task` and is imported only when one of its tasks is asked for; `template` is the model's chat template,
loaded (once per model) only for a task with `chat = true`.

Names are lm-eval's task names where the task is lm-eval's (so lm-eval logs and these records
speak of the same thing); `mmlu` is lm-eval's 57-subject group as one task, `math500` follows
lm-eval's `minerva_math500`. `wikitext_kl`, `needle`, `sessions`, `agentic` (long tool-calling sessions) and
`ruler` (RULER-style retrieval) are this toolkit's own probes.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from evals.errors import EvalError
from evals.prompts.chat import chat_template
from evals.tasks.base import Task, TaskOptions, WithReference
from quant.validation import did_you_mean

TASKS: dict[str, str] = {
    "gsm8k": "evals.tasks.gsm8k",
    "gsm8k_cot_llama": "evals.tasks.gsm8k",
    "gsm8k_cot_zeroshot": "evals.tasks.gsm8k",
    "gpqa_diamond_zeroshot": "evals.tasks.gpqa",
    "gpqa_main_zeroshot": "evals.tasks.gpqa",
    "gpqa_extended_zeroshot": "evals.tasks.gpqa",
    "gpqa_diamond_cot_zeroshot": "evals.tasks.gpqa",
    "gpqa_main_cot_zeroshot": "evals.tasks.gpqa",
    "gpqa_extended_cot_zeroshot": "evals.tasks.gpqa",
    "gpqa_diamond_cot_modelcard": "evals.tasks.gpqa_modelcard",
    "gpqa_main_cot_modelcard": "evals.tasks.gpqa_modelcard",
    "gpqa_extended_cot_modelcard": "evals.tasks.gpqa_modelcard",
    "mmlu": "evals.tasks.multiple_choice",
    "arc_challenge": "evals.tasks.multiple_choice",
    "arc_easy": "evals.tasks.multiple_choice",
    "piqa": "evals.tasks.multiple_choice",
    "boolq": "evals.tasks.multiple_choice",
    "winogrande": "evals.tasks.winogrande",
    "lambada_openai": "evals.tasks.lambada",
    "truthfulqa_mc1": "evals.tasks.truthfulqa",
    "truthfulqa_mc2": "evals.tasks.truthfulqa",
    "math500": "evals.tasks.math500",
    "wikitext_kl": "evals.tasks.wikitext_kl",
    "needle": "evals.tasks.needle",
    "sessions": "evals.tasks.sessions",
    "agentic": "evals.tasks.agentic",
    "agentic_bfcl": "evals.tasks.agentic",
    "ruler": "evals.tasks.ruler",
}

# The datasets each task reads (for env.json's data file hashes: task_datasets).
TASK_DATASETS: dict[str, tuple[str, ...]] = {
    "gsm8k": ("gsm8k",),
    "gsm8k_cot_llama": ("gsm8k",),
    "gsm8k_cot_zeroshot": ("gsm8k",),
    "gpqa_diamond_zeroshot": ("gpqa_diamond",),
    "gpqa_main_zeroshot": ("gpqa_main",),
    "gpqa_extended_zeroshot": ("gpqa_extended",),
    "gpqa_diamond_cot_zeroshot": ("gpqa_diamond",),
    "gpqa_main_cot_zeroshot": ("gpqa_main",),
    "gpqa_extended_cot_zeroshot": ("gpqa_extended",),
    "gpqa_diamond_cot_modelcard": ("gpqa_diamond",),
    "gpqa_main_cot_modelcard": ("gpqa_main",),
    "gpqa_extended_cot_modelcard": ("gpqa_extended",),
    "mmlu": ("mmlu",),
    "arc_challenge": ("arc_challenge",),
    "arc_easy": ("arc_easy",),
    "piqa": ("piqa",),
    "boolq": ("boolq",),
    "winogrande": ("winogrande",),
    "lambada_openai": ("lambada_openai",),
    "truthfulqa_mc1": ("truthfulqa_mc",),
    "truthfulqa_mc2": ("truthfulqa_mc",),
    "math500": ("math500",),
    "wikitext_kl": ("wikitext2",),
    "needle": (),
    "sessions": ("gsm8k",),
    "agentic": ("gsm8k", "wikitext2"),
    "agentic_bfcl": ("gsm8k",),
    "ruler": ("wikitext2",),
}


def _unknown(name: str) -> EvalError:
    return EvalError(f"unknown task {name!r}; {did_you_mean(name, TASKS, listing='known tasks')}")


def task_datasets(names: Iterable[str]) -> list[str]:
    """The datasets the named tasks read (TASK_DATASETS), in task order without duplicates; what
    evals.data.data_file_hashes takes for a run's tasks. An unknown task raises EvalError (did-you-mean)."""
    out: list[str] = []
    for name in names:
        if name not in TASK_DATASETS:
            raise _unknown(name)
        out.extend(d for d in TASK_DATASETS[name] if d not in out)
    return out


def get_task(name: str, options: TaskOptions | None = None, model: str | None = None) -> Task:
    """Build the named task with `options` (default: lm-eval's defaults) for `model` (whose chat template
    renders the prompts of a task with chat = true); unknown names suggest the closest."""
    if name not in TASKS:
        raise _unknown(name)
    module_name = TASKS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise EvalError(f"task {name!r} is not available in this build ({module_name} is missing)") from None
    options = options or TaskOptions()
    template = None
    if options.chat and getattr(module, "CHATS", True):  # a task that cannot chat refuses it in build
        if model is None:
            raise EvalError(f"task {name!r}: chat = true needs the model whose chat template renders the prompt")
        template = chat_template(model)
    task = module.build(name, options, template)
    if not options.reference_signal and not isinstance(task, WithReference):
        raise EvalError(f"{name}: reference_signal = false is not read (the task has no reference answer); "
                        "leave it unset")
    return task


def supports_chat(name: str) -> bool:
    """Whether the named task can render chat prompts (False for probes such as wikitext_kl and needle)."""
    if name not in TASKS:
        raise _unknown(name)
    return bool(getattr(importlib.import_module(TASKS[name]), "CHATS", True))
