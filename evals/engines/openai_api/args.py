"""The `openai` engine's arguments (an arm's `engine_args`): parsed once, frozen, unknown keys are errors.

Imports only pydantic: the spec layer validates arms with it without loading httpx.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evals.engines.load import LoadSpec, load_key_message
from evals.engines.openai_api.load import served_load_problem
from evals.errors import EngineError
from quant.validation import did_you_mean, first_error

# Seconds as the spec wrote them: an int stays an int, so the arm's canonical JSON (its fingerprint in
# arm.json) is what the user wrote, as it was before these arguments were typed.
Seconds = Annotated[float | int, Field(gt=0)]


class OpenAIArgs(BaseModel):
    """Engine arguments of an `openai` arm; `base_url` is filled in by `qa run` for an arm with a server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str | None = None  # e.g. http://127.0.0.1:8000/v1; every request goes here and nowhere else
    base_urls: tuple[str, ...] = ()  # several replicas of one deployment instead of base_url; requests spread over them
    api: Literal["completions", "chat"] = "completions"  # generation endpoint: /completions or /chat/completions
    # what serves it, which decides the sampling keys it honours (evals.engines.openai_api.sampling);
    # None: read off GET /models (`owned_by`: vllm, sglang, llamacpp; anything else is "openai")
    server_kind: Literal["vllm", "sglang", "llamacpp", "openai"] | None = None
    served_model: str | None = None  # the server's name for the model; None: the only one /models lists
    api_key_env: str | None = None  # NAME of the environment variable holding the key (never the key)
    concurrency: int = Field(default=4, ge=1, le=256)
    timeout_s: Seconds = 120.0  # per request (read/write/pool); connect is min(10, this)
    max_retries: int = Field(default=4, ge=0, le=20)  # extra attempts after the first
    backoff_base_s: Seconds = 0.5  # first retry waits up to this, doubling each time
    backoff_max_s: Seconds = 30.0
    seed: int = 0  # seeds the backoff jitter
    echo: bool | None = None  # None: probe the server once; False: it cannot echo (refuse scoring tasks)
    tokenizer: str | None = None  # HF folder or id for local tokenisation; None: the arm's model
    # send the evaluated requests amid filler clients, N in flight (evals.engines.openai_api.load; None: as called)
    load: LoadSpec | None = None

    @model_validator(mode="after")
    def _one_kind_of_address(self) -> OpenAIArgs:
        if self.base_url and self.base_urls:
            raise ValueError("base_url and base_urls: give one (base_urls lists every replica)")
        for url in [u for u in (self.base_url, *self.base_urls) if u]:
            problem = url_problem(url)
            if problem:
                raise ValueError(problem)
        if len(set(self.base_urls)) != len(self.base_urls):
            raise ValueError("base_urls lists a replica twice")
        if self.load is not None and (why := served_load_problem(self.load, self.model_fields_set,
                                                                 len(self.base_urls))) is not None:
            raise ValueError(why)
        return self

    def replica_urls(self) -> tuple[str, ...]:
        """Every replica's base URL ('/' stripped): base_urls, else (base_url,); EngineError when neither is set."""
        urls = self.base_urls or ((self.base_url,) if self.base_url else ())
        if not urls:
            raise EngineError("openai engine argument base_url: required (e.g. http://127.0.0.1:8000/v1), "
                              "or base_urls for several replicas")
        return tuple(validate_base_url(u) for u in urls)


def parse_openai_args(args: Mapping[str, object]) -> OpenAIArgs:
    """Validate `openai` engine arguments; a bad key or value is a one-line EngineError with did-you-mean."""
    try:
        return OpenAIArgs.model_validate(dict(args))
    except ValidationError as exc:
        err = first_error(exc)
        head, _, rest = err.where.partition(".")
        if head == "load" and rest:
            raise EngineError(f"openai engine: {load_key_message(rest, err.msg)}") from None
        if not err.where and err.msg.startswith(("load", "concurrency and load")):
            raise EngineError(f"openai engine: {err.msg}") from None
        where = err.where_or("engine_args")
        hint = f"; {did_you_mean(where, OpenAIArgs.model_fields)}" if err.type == "extra_forbidden" else ""
        raise EngineError(f"openai engine argument {where}: {err.msg}{hint}") from None


def url_problem(url: str) -> str | None:
    """What is wrong with a base URL (None: it is http(s)://host[:port][/path] without credentials,
    query or fragment)."""
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError for a port that is not a number in 0-65535
    except ValueError:
        return f"base_url {url!r} must look like http://HOST:PORT/v1"
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        return f"base_url {url!r} must look like http://HOST:PORT/v1"
    if parts.username or parts.password:
        return ("base_url must not carry credentials; put the key in an environment variable "
                "and name it with api_key_env")
    if parts.query or parts.fragment:
        return f"base_url {url!r} must not have a query or fragment"
    return None


def validate_base_url(url: str | None) -> str:
    """Check `url` is http(s)://host[:port][/path] without credentials, query or fragment; strip '/'."""
    if not url:
        raise EngineError("openai engine argument base_url: required (e.g. http://127.0.0.1:8000/v1)")
    problem = url_problem(url)
    if problem:
        raise EngineError(problem)
    return url.rstrip("/")
