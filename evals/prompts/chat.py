"""Chat prompts exactly as lm-eval builds them with `--apply_chat_template`, rendered with the model's
own tokenizer chat template.

Messages (lm-eval 0.4, api/task.py `ConfigurableTask.fewshot_context` + `build_qa_turn`, api/utils.py
`maybe_delimit` / `multiturn_to_singleturn`): a system message holds the system instruction and the
task description joined by the few-shot delimiter; each shot is a user turn (question, then the
target delimiter) and an assistant turn (answer, then the few-shot delimiter); the document is the
last user turn. With `fewshot_as_multiturn` the turns are sent as they are, else they are joined into
one user message (each turn's text plus its delimiter, the last delimiter dropped). A `gen_prefix`
becomes a final assistant message the model continues (assistant prefill).

Rendering (lm_eval/models/huggingface.py `HFLM.apply_chat_template`): the tokenizer's
`apply_chat_template(tokenize=False, add_generation_prompt=not gen_prefix,
continue_final_message=bool(gen_prefix), **chat_template_args)`; a template that refuses the system
role is retried without it, as lm-eval does. The tokenizer is loaded once per model and process.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2

from evals.engines.base import Message
from evals.errors import EvalError, ModelError
from evals.models.resolve import resolve_model

TemplateKwargs = tuple[tuple[str, str | int | float | bool], ...]
# Splits a rendered prompt at the document: what precedes it is shared by every item (the cacheable prefix).
SPLIT_MARK = "\x00qa-document\x00"


def maybe_delimit(prefix: str | None, suffix: str | None, delimiter: str = " ") -> str:
    """lm-eval api/utils.maybe_delimit: join with `delimiter` unless either side has whitespace at the seam."""
    if not prefix:
        return suffix or ""
    if not suffix:
        return prefix
    return prefix + suffix if prefix[-1].isspace() or suffix[0].isspace() else prefix + delimiter + suffix


def requires_delimiter(prefix: str, suffix: str) -> bool:
    """lm-eval api/utils.requires_delimiter: neither side has whitespace at the seam."""
    return prefix != "" and not (prefix[-1].isspace() or suffix[0].isspace())


@dataclass(frozen=True)
class ChatTurn:
    """One lm-eval Message: role, content and the delimiter its plain-text rendering appends."""

    role: str
    content: str
    delimiter: str = ""


def qa_turn(question: str, answer: str | None, gen_prefix: str | None, target_delimiter: str,
            fewshot_delimiter: str) -> list[ChatTurn]:
    """lm-eval build_qa_turn: the user turn, then the answer (a shot) or the gen_prefix (the document)."""
    has_answer = answer is not None and answer != ""
    if has_answer and not gen_prefix or gen_prefix and requires_delimiter(question, gen_prefix):
        user_delim = target_delimiter
    else:
        user_delim = ""
    turns = [ChatTurn("user", question, user_delim)]
    if has_answer:
        turns.append(ChatTurn("assistant", maybe_delimit(gen_prefix, answer, " "), fewshot_delimiter))
    elif gen_prefix:
        turns.append(ChatTurn("assistant", gen_prefix))
    return turns


def single_turn(turns: Sequence[ChatTurn]) -> list[ChatTurn]:
    """lm-eval multiturn_to_singleturn: system kept, the rest joined into one user message (a final
    assistant prefill kept after it)."""
    system, rest = (turns[0], list(turns[1:])) if turns and turns[0].role == "system" else (None, list(turns))
    tail = [rest.pop()] if rest[-1].role == "assistant" else []
    body = "".join(t.content + t.delimiter for t in rest[:-1]) + rest[-1].content
    out = [ChatTurn("user", body)] + [ChatTurn("assistant", t.content) for t in tail]
    return [ChatTurn("system", system.content)] + out if system is not None else out


@dataclass(frozen=True)
class ChatStyle:
    """How a task's turns become chat messages (lm-eval's --system_instruction, --fewshot_as_multiturn)."""

    system_prompt: str | None = None
    fewshot_as_multiturn: bool = False
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"


def chat_turns(description: str, shots: Sequence[tuple[str, str]], question: str, style: ChatStyle,
               gen_prefix: str | None = None) -> list[ChatTurn]:
    """The messages lm-eval's fewshot_context sends to the chat template for one document."""
    turns: list[ChatTurn] = []
    system = maybe_delimit(style.system_prompt, description, style.fewshot_delimiter)
    if system:
        turns.append(ChatTurn("system", system))
    for q, a in shots:
        turns += qa_turn(q, a, None, style.target_delimiter, style.fewshot_delimiter)
    turns += qa_turn(question, None, gen_prefix, style.target_delimiter, "")
    return [ChatTurn(t.role, t.content) for t in turns] if style.fewshot_as_multiturn else single_turn(turns)


def load_tokenizer(model: str, trust_remote_code: bool = False) -> Any:
    """The transformers tokenizer of a model name (evals.models.resolve.resolve_model); ModelError when missing."""
    from transformers import AutoTokenizer  # transformers: only when a chat template is loaded

    resolved = resolve_model(model)
    try:
        return AutoTokenizer.from_pretrained(resolved.load_id, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise ModelError(f"cannot load the tokenizer of {model!r}: {str(exc).splitlines()[0]}") from None


class ChatTemplate:
    """A model's own chat template (its tokenizer's), rendering messages as lm-eval's HFLM does."""

    def __init__(self, name: str, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise EvalError(f"model {name!r} has no chat template: set chat = false for its tasks "
                            "(or use a chat/instruct model)")
        self.name = name
        self.tokenizer = tokenizer

    def render(self, messages: Sequence[Message], *, gen_prefix: bool = False,
               kwargs: Mapping[str, Any] | None = None) -> str:
        """The prompt text: a generation prompt opened, or (gen_prefix) the last assistant message continued."""
        history = [{"role": m.role, "content": m.content} for m in messages]
        call = functools.partial(self.tokenizer.apply_chat_template, tokenize=False,
                                 add_generation_prompt=not gen_prefix, continue_final_message=gen_prefix,
                                 **dict(kwargs or {}))
        try:
            text = call(history)
        except jinja2.exceptions.TemplateError:  # lm-eval: retry without the system role
            try:
                text = call([m for m in history if m["role"] != "system"])
            except jinja2.exceptions.TemplateError as exc:
                raise EvalError(f"model {self.name!r}: its chat template refused the messages ({exc})") from None
        if not isinstance(text, str):
            raise EvalError(f"model {self.name!r}: its chat template did not render text")
        return text


@functools.lru_cache(maxsize=4)
def chat_template(model: str, trust_remote_code: bool = False) -> ChatTemplate:
    """The chat template of a model name, its tokenizer loaded once per process; EvalError without one."""
    return ChatTemplate(model, load_tokenizer(model, trust_remote_code))


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered chat prompt: the text engines tokenise, the messages a chat endpoint receives, and the
    part shared with every other item (the few-shot turns before the document), when there is one."""

    text: str
    messages: tuple[Message, ...]
    prefix: str | None


class ChatRenderer:
    """Builds and renders one task's chat prompts with a model's template and the task's chat options."""

    def __init__(self, template: ChatTemplate, style: ChatStyle,
                 template_kwargs: Mapping[str, str | int | float | bool] | None = None) -> None:
        self.template = template
        self.style = style
        self.kwargs = dict(template_kwargs or {})

    @property
    def kwargs_items(self) -> TemplateKwargs:
        """The chat_template_kwargs as the sorted pairs a GenerateRequest carries."""
        return tuple(sorted(self.kwargs.items()))

    def prompt(self, description: str, shots: Sequence[tuple[str, str]], question: str,
               gen_prefix: str | None = None) -> ChatPrompt:
        """The document's chat prompt, and the rendered text before it when every item shares that text."""
        turns = chat_turns(description, shots, question, self.style, gen_prefix)
        messages = tuple(Message(t.role, t.content) for t in turns)
        text = self.template.render(messages, gen_prefix=bool(gen_prefix), kwargs=self.kwargs)
        marked = chat_turns(description, shots, SPLIT_MARK, self.style, gen_prefix)
        probe = self.template.render([Message(t.role, t.content) for t in marked], gen_prefix=bool(gen_prefix),
                                     kwargs=self.kwargs)
        head = probe.split(SPLIT_MARK, 1)[0] if SPLIT_MARK in probe else ""
        return ChatPrompt(text=text, messages=messages, prefix=head if head and text.startswith(head) else None)
