"""Which request keys each kind of OpenAI-compatible server honours, and the one-line refusal of a
setting a server would ignore.

OpenAI's own API takes temperature, top_p, max_tokens, stop and seed; it has no top_k or min_p and
no chat_template_kwargs. vLLM (its "extra sampling parameters": top_k, min_p, skip_special_tokens,
chat_template_kwargs), SGLang (the same names) and llama.cpp's server (top_k and min_p are its own
native samplers; chat_template_kwargs since 2025) honour them. A server of unknown kind is treated
as OpenAI's: asking it for top_k or min_p would be silently ignored, so it is an error instead, as
are more than 4 stop strings (OpenAI's limit).
The kind comes from the arm's `server` argument or from GET /models (`owned_by`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, get_args

from pydantic import JsonValue

from evals.engines.base import GenerateRequest
from evals.errors import EngineError

ServerKind = Literal["vllm", "sglang", "llamacpp", "openai"]
SERVER_KINDS: tuple[ServerKind, ...] = get_args(ServerKind)
EXTRA_SAMPLING: dict[ServerKind, frozenset[str]] = {  # keys beyond OpenAI's own that a kind honours
    "vllm": frozenset({"top_k", "min_p", "chat_template_kwargs", "skip_special_tokens"}),
    "sglang": frozenset({"top_k", "min_p", "chat_template_kwargs", "skip_special_tokens"}),
    "llamacpp": frozenset({"top_k", "min_p", "chat_template_kwargs"}),
    "openai": frozenset(),
}
# OpenAI's API takes at most 4 stop strings. vLLM's server takes VLLM_MAX_STOP_STRINGS (default 4:
# start it with that variable raised for a task with more, e.g. gsm8k_cot_llama's 5); llama.cpp's, any.
OPENAI_MAX_STOP = 4


def kind_from_models(body: JsonValue) -> ServerKind:
    """The server kind a GET /models body names by `owned_by` ("openai" when it names none we know)."""
    data = body.get("data") if isinstance(body, Mapping) else None
    owners = {m.get("owned_by") for m in data if isinstance(m, Mapping)} if isinstance(data, list) else set()
    for kind in SERVER_KINDS:
        if kind in owners:
            return kind
    return "openai"


def requested_extras(req: GenerateRequest, api: Literal["completions", "chat"]) -> list[str]:
    """The keys beyond OpenAI's own that `req` needs the server to honour (top_k, min_p; and
    chat_template_kwargs on the chat endpoint: a completions prompt is rendered already)."""
    keys = [k for k, on in (("top_k", req.top_k > 0), ("min_p", req.min_p > 0)) if on]
    if api == "chat" and req.chat_template_kwargs:
        keys.append("chat_template_kwargs")
    return keys


def check_sampling(kind: ServerKind, api: Literal["completions", "chat"], requests: Sequence[GenerateRequest],
                   base_url: str = "the server") -> None:
    """EngineError (one line) when a request asks for a key this kind of server would ignore, or for
    more stop strings than OpenAI's API takes."""
    honoured = EXTRA_SAMPLING[kind]
    for req in requests:
        if kind == "openai" and len(req.until) > OPENAI_MAX_STOP:
            raise EngineError(
                f"the task stops at {len(req.until)} strings; OpenAI's API takes at most {OPENAI_MAX_STOP} "
                f"({base_url}); set the task's stop, or name the server kind with engine_args.server_kind"
            )
        missing = [k for k in requested_extras(req, api) if k not in honoured]
        if missing:
            raise EngineError(
                f"{', '.join(missing)} set, but {base_url} is a {kind!r} server, which ignores "
                f"{'it' if len(missing) == 1 else 'them'}; drop the setting, or name the server kind with "
                f"engine_args.server_kind (one of {', '.join(k for k in SERVER_KINDS if k != 'openai')} honour it)"
            )


def sampling_body(kind: ServerKind, req: GenerateRequest, api: Literal["completions", "chat"]) -> dict[str, JsonValue]:
    """The generation settings of a request's payload: OpenAI's keys, and the others for a server
    that honours them (check_sampling refused the rest before)."""
    body: dict[str, JsonValue] = {"max_tokens": req.max_tokens, "temperature": req.temperature, "top_p": req.top_p}
    if req.until:
        body["stop"] = list(req.until)
    if req.seed is not None:
        body["seed"] = req.seed
    if req.top_k > 0:
        body["top_k"] = req.top_k
    if req.min_p > 0:
        body["min_p"] = req.min_p
    if api == "chat" and req.chat_template_kwargs:
        body["chat_template_kwargs"] = dict(req.chat_template_kwargs)
    if "skip_special_tokens" in EXTRA_SAMPLING[kind]:
        body["skip_special_tokens"] = True  # the text the hf and vllm engines decode
    return body
