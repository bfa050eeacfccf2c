"""Reasoning and answer: split a generation at its think tags, and decide whether it was truncated.

A reasoning model writes `<think> ... </think>` before its answer (the tags are a task option,
TaskOptions.think_tags). Only the answer is scored. The split follows vLLM's think-tag reasoning
parsers (vllm/reasoning/basic_parsers.py, `BaseThinkingReasoningParser.extract_reasoning`, used by
`deepseek_r1`): a start tag in the output is dropped and everything before the end tag is
reasoning. The opening tag may be missing from the output because the chat template put it at the
end of the prompt (DeepSeek-R1's and Qwen3's templates do): then the output starts inside the
reasoning, as deepseek_r1 assumes. Unlike deepseek_r1, an output with neither tag whose prompt did
not open a reasoning block is all answer (a model that does not reason), so a plain instruct model
is scored on its whole output.

A server with a reasoning parser returns the reasoning separately (`reasoning_content`, see
GenerateResult.reasoning); its `text` is then already the answer, and is split again only if it
still holds tags.

A sample is *truncated* when it stopped at max_tokens (finish reason "length") before its final
answer: its reasoning never closed, or an answer filter of the task found no answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# What lm-eval's filters leave when they find no answer: regex filters' fallback "[invalid]",
# minerva math's "[invalidanswer]"; an empty string or None is no answer either.
NO_ANSWER = frozenset({"", "[invalid]", "[invalidanswer]"})
ThinkTags = tuple[str, str]
DEFAULT_THINK_TAGS: ThinkTags = ("<think>", "</think>")


@runtime_checkable
class WithThinkTags(Protocol):
    """A task that names its reasoning delimiters (None: no reasoning split)."""

    think_tags: tuple[str, str] | None


@dataclass(frozen=True)
class ThinkSplit:
    """A generation split into its reasoning (None when it had none) and its answer (what is scored).
    `closed` is False when the reasoning began and never ended (the answer is then "")."""

    answer: str
    reasoning: str | None
    closed: bool


def think_tags(task: object) -> ThinkTags | None:
    """A task's reasoning delimiters: its `think_tags` attribute (DEFAULT_THINK_TAGS when it has
    none; None: the task turned the split off)."""
    tags = task.think_tags if isinstance(task, WithThinkTags) else DEFAULT_THINK_TAGS
    return None if tags is None else (str(tags[0]), str(tags[1]))


def opens_reasoning(prompt: str, tags: ThinkTags | None) -> bool:
    """Whether the prompt ends inside a reasoning block (the chat template wrote the start tag last)."""
    if tags is None:
        return False
    return prompt.rstrip().endswith(tags[0])


def split_tags(text: str, tags: ThinkTags, *, opened: bool) -> ThinkSplit:
    """Split `text` at the think tags; `opened`: the prompt already opened the reasoning block."""
    start, end = tags
    head, sep, rest = text.partition(start)
    if sep and not head.strip():  # "<think>..." (text before a start tag is answer, as vLLM's olmo3 keeps it)
        body, opened = rest, True
    elif sep:
        return _after_start(head, rest, end)
    else:
        body = text
    reasoning, sep, answer = body.partition(end)
    if sep:
        return ThinkSplit(answer=answer, reasoning=reasoning, closed=True)
    if opened:
        return ThinkSplit(answer="", reasoning=body, closed=False)
    return ThinkSplit(answer=text, reasoning=None, closed=True)


def _after_start(head: str, rest: str, end: str) -> ThinkSplit:
    """Answer text, then a reasoning block: the reasoning is what lies between the tags."""
    reasoning, sep, tail = rest.partition(end)
    if not sep:
        return ThinkSplit(answer=head, reasoning=reasoning, closed=False)
    return ThinkSplit(answer=head + tail, reasoning=reasoning, closed=True)


def split_reasoning(text: str, tags: ThinkTags | None, *, prompt: str = "",
                    server_reasoning: str | None = None) -> ThinkSplit:
    """The answer and the reasoning of one generation: `server_reasoning` (a server's
    reasoning_content) and whatever the think `tags` delimit in `text` (None: no tag split)."""
    if tags is None:
        return ThinkSplit(answer=text, reasoning=server_reasoning, closed=True)
    if server_reasoning is not None:
        # the server split it: `text` is the content after the reasoning (empty while the reasoning ran)
        inner = split_tags(text, tags, opened=False)
        parts = [server_reasoning] + ([inner.reasoning] if inner.reasoning is not None else [])
        closed = inner.closed and bool(text.strip() or not server_reasoning)
        return ThinkSplit(answer=inner.answer, reasoning="".join(parts), closed=closed)
    return split_tags(text, tags, opened=opens_reasoning(prompt, tags))


def is_truncated(finish_reason: str, split: ThinkSplit, extracted: Mapping[str, str | None]) -> bool:
    """Stopped at max_tokens before the final answer: the reasoning never closed, or a filter of the
    task found no answer (a task with no filters: any length stop counts). "A filter", not "every
    filter": a lenient filter (gsm8k's flexible-extract takes the last number anywhere) finds a
    number in almost any chain of thought cut short, which is no final answer."""
    if finish_reason != "length":
        return False
    if not split.closed or not extracted:
        return True
    return any(value is None or value.strip() in NO_ANSWER for value in extracted.values())
