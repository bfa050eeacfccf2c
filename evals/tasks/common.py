"""What every lm-eval-compatible task shares: lm-eval's prompt assembly, its few-shot sampler, the
multiple-choice metrics, and option checks.

lm-eval (v0.4, `ConfigurableTask.fewshot_context` without a chat template) renders a context as
`description + sum(q_i + target_delimiter + a_i + fewshot_delimiter) + q`; a multiple-choice request
scores `target_delimiter + choice` given that context. These helpers reproduce exactly that, and
tests/evals/tasks/test_prompts.py checks the bytes against lm-eval's own task objects.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evals.data import Row
from evals.engines.base import GenerateRequest, LoglikelihoodRequest
from evals.errors import EvalError
from evals.prompts.chat import ChatPrompt, ChatRenderer, ChatStyle, ChatTemplate, TemplateKwargs
from evals.tasks.base import Item, Request, TaskOptions

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


@dataclass(frozen=True)
class GenSettings:
    """A generation task's settings: its lm-eval `generation_kwargs` defaults, overridden by TaskOptions."""

    until: tuple[str, ...]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0


def gen_settings(options: TaskOptions, until: tuple[str, ...], max_tokens: int = LM_EVAL_MAX_GEN_TOKS,
                 temperature: float = 0.0, top_p: float = 1.0) -> GenSettings:
    """The task defaults given (lm-eval's YAML), each replaced by the option the user set."""
    return GenSettings(
        until=until if options.stop is None else tuple(options.stop),
        max_tokens=options.max_tokens or max_tokens,
        temperature=temperature if options.temperature is None else options.temperature,
        top_p=top_p if options.top_p is None else options.top_p,
        top_k=options.top_k or 0,
        min_p=options.min_p or 0.0,
    )


def generate_request(prompt: str, settings: GenSettings, seed: int, prefix: str | None = None,
                     chat: ChatPrompt | None = None, chat_kwargs: TemplateKwargs = ()) -> GenerateRequest:
    """A generation request (a chat one carries its messages); the per-sample seed is passed on only
    when sampling (temperature > 0)."""
    return GenerateRequest(
        prompt=prompt if chat is None else chat.text,
        until=settings.until,
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        min_p=settings.min_p,
        seed=seed if settings.temperature > 0 else None,
        prefix=prefix,
        messages=chat.messages if chat is not None else (),
        chat_template_kwargs=chat_kwargs if chat is not None else (),
    )


def text_generate_request(chat: ChatRenderer | None, settings: GenSettings, seed: int, text: str,
                          shots: Sequence[tuple[str, str]] = (), fewshot: str = "",
                          shared: bool = True) -> GenerateRequest:
    """Generate after `text`: under chat, `shots` as turns and `text` as the user's turn; plain, `fewshot`
    (the rendered shots) + `text`. With `shared` (every item has the same shots), what precedes the item's
    own text is the cacheable prefix: the chat prompt's head, or the plain few-shot block when there is one."""
    if chat is not None:
        rendered = chat.prompt("", shots, text)
        return generate_request(rendered.text, settings, seed, rendered.prefix if shared else None, rendered,
                                chat.kwargs_items)
    return generate_request(fewshot + text, settings, seed, fewshot if shared and fewshot else None)


def rendered_context(chat: ChatRenderer | None, text: str) -> tuple[str, str | None]:
    """A zero-shot log-likelihood context and its cacheable prefix: `text` as the user's turn of a chat
    prompt (its head the prefix), or `text` itself with no prefix."""
    if chat is None:
        return text, None
    rendered = chat.prompt("", (), text)
    return rendered.text, rendered.prefix


def generate_prompt(request: Request) -> str:
    """A generation request's full prompt (lm-eval's prompt hash input)."""
    assert isinstance(request, GenerateRequest)
    return request.prompt


def loglikelihood_context(request: Request) -> str:
    """A log-likelihood request's context string (lm-eval's prompt hash input)."""
    assert isinstance(request, LoglikelihoodRequest)
    return request.context


def reference_continuation(target: str, chat: bool, delimiter: str = TARGET_DELIMITER) -> str:
    """A reference answer as the continuation of its prompt: `delimiter + target` after a plain prompt
    (as a log-likelihood continuation is written), the bare target after a chat prompt (whose rendering
    ends with the assistant's turn opened)."""
    return target if chat else delimiter + target


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


GENERATION_OPTIONS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "think_tags")
CHAT_OPTIONS = ("system_prompt", "fewshot_as_multiturn", "chat_template_kwargs")
_DEFAULTS = TaskOptions()


def options_set(options: TaskOptions, names: Sequence[str]) -> list[str]:
    """The named options that differ from their defaults (what the user set)."""
    return [n for n in names if getattr(options, n) != getattr(_DEFAULTS, n)]


def check_options(task: str, options: TaskOptions, *, generates: bool, chats: bool | str,
                  extra: bool = False, reads: Sequence[str] = ()) -> None:
    """Refuse every option the task does not read, in one line: generation settings (but `reads`) on a
    task that generates nothing, chat on a task that cannot chat (`chats` is then the reason), chat
    settings without chat = true, `extra` keys on a task that reads none."""
    # temperature 0.0 is greedy, what scoring given text amounts to (and what older specs wrote out)
    unread = [n for n in options_set(options, GENERATION_OPTIONS)
              if n not in reads and not (n == "temperature" and options.temperature == 0.0)]
    if not generates and unread:
        raise EvalError(f"{task}: {', '.join(unread)} not read: the task generates nothing (it scores given "
                        "text); leave them unset")
    if options.chat and chats is not True:
        raise EvalError(f"{task}: chat = true is not supported ({chats}); set chat = false for this task")
    if not options.chat and (unread := options_set(options, CHAT_OPTIONS)):
        raise EvalError(f"{task}: {', '.join(unread)} only apply with chat = true")
    if not extra and options.extra:
        raise EvalError(f"{task}: unknown option(s) {sorted(options.extra)}; this task takes none")


def chat_renderer(task: str, options: TaskOptions, template: ChatTemplate | None,
                  target_delimiter: str = TARGET_DELIMITER,
                  fewshot_delimiter: str = FEWSHOT_DELIMITER) -> ChatRenderer | None:
    """The task's chat renderer when options.chat (None otherwise); EvalError when no template was given."""
    if not options.chat:
        return None
    if template is None:
        raise EvalError(f"{task}: chat = true needs the model's chat template (build the task with its model)")
    style = ChatStyle(system_prompt=options.system_prompt, fewshot_as_multiturn=options.fewshot_as_multiturn,
                      target_delimiter=target_delimiter, fewshot_delimiter=fewshot_delimiter)
    return ChatRenderer(template, style, options.chat_template_kwargs)



def zero_shot_chat(task: str, options: TaskOptions, template: ChatTemplate | None, *,
                   generates: bool) -> ChatRenderer | None:
    """A zero-shot task's option checks (no few-shot pool; every option it does not read refused) and its
    chat renderer (None without chat = true)."""
    resolve_fewshot(task, options, 0, None)
    check_options(task, options, generates=generates, chats=True)
    return chat_renderer(task, options, template)
