"""The `openai` engine's chat endpoint (`api = "chat"`): POST /chat/completions with the request's
messages; the server renders them with its chat template.

The payload carries OpenAI's keys (max_tokens, temperature, top_p, stop, seed) and, for a server
that honours them (evals.engines.openai_api.sampling), top_k, min_p, `chat_template_kwargs` (vLLM's
and llama.cpp's extra body key, e.g. enable_thinking) and `skip_special_tokens`. The answer is
`message.content`; the reasoning a server's reasoning parser split off is `reasoning_content`
(llama.cpp, SGLang, earlier vLLM) or `reasoning` (vLLM 0.32's name). A chat endpoint returns no
prompt log-probs, so log-likelihood tasks are refused on it (completions.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import JsonValue

from evals.engines.base import GenerateRequest, GenerateResult
from evals.engines.openai_api.sampling import ServerKind, sampling_body
from evals.engines.stops import cut_at_stop
from evals.errors import EngineError

REASONING_FIELDS = ("reasoning_content", "reasoning")  # where servers put the reasoning, first found wins
NO_MESSAGES_HINT = (
    "api = 'chat' posts chat messages, and this task's requests have none; set chat = true for the task "
    "(or in [chat]), or use api = 'completions'"
)
NO_SCORING_HINT = (
    "a chat endpoint returns no prompt log-probs, so it cannot score log-likelihood or token-distribution "
    "tasks; use api = 'completions' for this arm"
)


def check_chat_requests(requests: list[GenerateRequest], base_url: str) -> None:
    """EngineError when a request has no messages to post (a task not built for chat)."""
    if any(not req.messages for req in requests):
        raise EngineError(f"{base_url}: {NO_MESSAGES_HINT}")


def chat_payload(req: GenerateRequest, kind: ServerKind) -> dict[str, JsonValue]:
    """The /chat/completions body of one request (the model name is added by the client)."""
    messages: list[JsonValue] = [{"role": m.role, "content": m.content} for m in req.messages]
    return {"messages": messages, **sampling_body(kind, req, "chat")}


def message_reasoning(message: Mapping[str, Any]) -> str | None:
    """The reasoning a server's reasoning parser returned beside the content (None: none)."""
    for name in REASONING_FIELDS:
        value = message.get(name)
        if isinstance(value, str):
            return value
    return None


def parse_chat(body: Mapping[str, Any], req: GenerateRequest,
               count_tokens: Callable[[str], int]) -> GenerateResult:
    """A GenerateResult from a /chat/completions body: content (cut at the stop strings), the
    reasoning, the finish reason and usage.completion_tokens (else `count_tokens` of the text)."""
    choice = body["choices"][0]
    message = choice.get("message") if isinstance(choice, Mapping) else None
    if not isinstance(message, Mapping):
        raise TypeError("the response choice has no message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise TypeError("the response message's content is not text")
    reasoning = message_reasoning(message)
    text = cut_at_stop(content or "", req.until)
    usage = body.get("usage")
    counted = usage.get("completion_tokens") if isinstance(usage, Mapping) else None
    tokens = counted if isinstance(counted, int) else count_tokens((reasoning or "") + text)
    finish = "length" if choice.get("finish_reason") == "length" else "stop"
    return GenerateResult(text=text, output_tokens=tokens, finish_reason=finish, reasoning=reasoning)
