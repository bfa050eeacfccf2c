"""The text of an `agentic` session (evals.tasks.agentic): the instruction and turn formats, the WikiText-2
passages read functions return, and the tool-call scorer (a turn and its prompts: evals.tasks.session_turns)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from evals.tasks.base import Scored
from evals.tasks.common import TARGET_DELIMITER
from evals.tasks.sessions import GSM8K_UNTIL, INVALID
from evals.tasks.tool_calls import check_calls, decode_calls, decode_first_span, render_calls

# characters per token, measured on SmolLM2's tokenizer (Gemma-3's within 10%): GSM8K, fact lines, WikiText, the
# JSON function docs, tool and look-up turns (a call, its result: digits and punctuation)
CHARS_PER_TOKEN = {"gsm8k": 2.8, "fact": 1.5, "wiki": 4.3, "json": 3.5, "turn": 2.65}
USER_UNTIL = ("User:", "Tool:")
LINE_UNTIL = ("\n", *USER_UNTIL, *GSM8K_UNTIL)
INTRO = ("You are an assistant that can call the functions documented below. When a request needs a function, "
         "answer with the call alone, on one line, in Python syntax: [function_name(parameter=value, ...)]. The "
         "function's result follows on a line that starts with 'Tool:'. Answer every other question directly.\n\n")
FUNCTIONS_HEADER = "Functions:\n"
FACTS_HEADER = "Reference facts:\n"
EXAMPLES_HEADER = "Worked examples:\n\n"
CONVERSATION_HEADER = "Conversation:\n\n"
QUESTION = "User: {text}\nAssistant:"
LOOKUP_TEXT = "What is the value stored under {key} in the reference facts?"
SHOT = "User: {question}\nAssistant:" + TARGET_DELIMITER + "{answer}\n\n"


def haystack_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """WikiText-2's text lines without blanks and headings (" = Title = "), stripped."""
    return [r["text"].strip() for r in rows if r["text"].strip() and not r["text"].lstrip().startswith("=")]


def passage(lines: Sequence[str], rng: random.Random, n_chars: int) -> str:
    """About n_chars characters of consecutive haystack lines from a seeded start, cut at a space."""
    start = rng.randrange(len(lines))
    out, size, i = [], 0, start
    while size < n_chars:
        out.append(lines[i % len(lines)])
        size += len(out[-1]) + 1
        i += 1
    text = " ".join(out)
    cut = text.rfind(" ", 0, n_chars)
    return text[: cut if cut > 0 else n_chars]


def score_tool(completion: str, tool: Mapping[str, Any]) -> Scored:
    """A tool turn: strict = the completion's first line decodes as calls that pass the AST checker; flexible =
    the first bracketed call list anywhere in it; meta says parsed (valid) and BFCL's error type."""
    docs, answers = tool["docs"], tool["answers"]
    strict = decode_calls(completion.strip().split("\n", 1)[0])
    flexible = decode_first_span(completion) or strict
    checks = {k: check_calls(docs, calls, answers) if calls else None
              for k, calls in (("strict-match", strict), ("flexible-extract", flexible))}
    scores: dict[str, float | None] = {f"exact_match,{k}": float(c is not None and c.correct) for k, c in checks.items()}
    extracted: dict[str, str | None] = {k: render_calls(c) if c else INVALID
                                        for k, c in (("strict-match", strict), ("flexible-extract", flexible))}
    first = checks["strict-match"]
    meta: dict[str, str | int | float | bool | None] = {
        "function": tool["function"], "tool_parsed": strict is not None, "tool_correct": bool(first and first.correct),
        "tool_error": "not_parsed" if first is None else first.error_type or None}
    if tool.get("source"):
        meta["tool_source"] = tool["source"]  # a BFCL entry id
    return Scored(scores=scores, extracted=extracted, target=tool["answer"], meta=meta)
