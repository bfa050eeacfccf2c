"""The `openai` engine: any OpenAI-compatible completions server (vLLM, SGLang, llama.cpp's server).

Generation is a plain `/completions` call. Log-likelihood and teacher-forced token distributions
use `echo` + `logprobs` on a prompt of token ids (tokenised locally with the model's tokenizer, split
as lm-eval splits context and continuation) and read the prompt tokens' log-probabilities back, as
lm-eval's `local-completions` does. A server that does not echo prompt log-probs (llama.cpp's server
ignores `echo`) is detected by a probe and refused for those tasks with an EngineError, never
answered with wrong numbers.

Traffic goes only to `base_url` (no redirects, no proxy from the environment). The API key is read
from the environment variable named by `api_key_env` and never stored in the engine's info.
Requests run on a bounded thread pool; transient failures (connection errors, timeouts, 408/429/5xx)
are retried with exponential backoff and jitter drawn from a seeded RNG; a request that still fails
is answered with `Failure(error)` in its slot.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evals.engines.base import (
    EngineInfo,
    Failure,
    GenerateRequest,
    GenerateResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    TokenLogprobsRequest,
)
from evals.errors import EngineError
from evals.models import ResolvedModel
from evals.records import TokenLogprobs
from quant.validation import did_you_mean, first_error

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})  # worth another try
TOKEN_ID_PREFIX = "token_id:"  # vLLM's `return_tokens_as_token_ids` spelling of a token
NO_ECHO_HINT = (
    "log-likelihood and token-distribution tasks need a server that echoes prompt "
    "log-probs (vLLM, SGLang); llama.cpp's server ignores echo: run generative tasks there"
)
T = TypeVar("T")


class OpenAIArgs(BaseModel):
    """Engine arguments of one arm (`[arms.X.engine_args]` in a spec); unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str  # e.g. http://127.0.0.1:8000/v1; every request goes here and nowhere else
    served_model: str | None = None  # the server's name for the model; None: the only one /models lists
    api_key_env: str | None = None  # NAME of the environment variable holding the key (never the key)
    concurrency: int = Field(default=4, ge=1, le=256)
    timeout_s: float = Field(default=120.0, gt=0)  # per request (read/write/pool); connect is min(10, this)
    max_retries: int = Field(default=4, ge=0, le=20)  # extra attempts after the first
    backoff_base_s: float = Field(default=0.5, gt=0)  # first retry waits up to this, doubling each time
    backoff_max_s: float = Field(default=30.0, gt=0)
    seed: int = 0  # seeds the backoff jitter
    echo: bool | None = None  # None: probe the server once; False: it cannot echo (refuse scoring tasks)
    tokenizer: str | None = None  # HF folder or id for local tokenisation; None: the arm's model


def validate_base_url(url: str) -> str:
    """Check `url` is http(s)://host[:port][/path] without credentials, query or fragment; strip '/'."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineError(f"base_url {url!r} must look like http://HOST:PORT/v1")
    if parts.username or parts.password:
        raise EngineError(
            "base_url must not carry credentials; put the key in an environment variable "
            "and name it with api_key_env"
        )
    if parts.query or parts.fragment:
        raise EngineError(f"base_url {url!r} must not have a query or fragment")
    return url.rstrip("/")


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Token ids of (context, continuation) as lm-eval makes them: trailing spaces of the context move
    to the continuation, the two are encoded together and split after the context's tokens; an empty
    context becomes the prefix token (BOS, else EOS)."""
    if not context:
        prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        return [prefix], list(tokenizer.encode(continuation))
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = list(tokenizer.encode(context + continuation))
    ctx = list(tokenizer.encode(context))
    return whole[: len(ctx)], whole[len(ctx) :]


class _Permanent(Exception):
    """A request failure that another attempt will not fix (HTTP 4xx other than the retry set)."""


class _Exhausted(Exception):
    """A transient failure (connection, timeout, 408/429/5xx) that outlasted every retry."""


@dataclass(frozen=True)
class _EchoedPrompt:
    """The server's echo of one prompt: per position, the token key, its log-prob (None at 0) and
    the top alternatives (token key -> log-prob)."""

    tokens: list[str]
    logprobs: list[float | None]
    top: list[dict[str, float] | None]


def _token_id(key: str) -> int | None:
    return int(key[len(TOKEN_ID_PREFIX) :]) if key.startswith(TOKEN_ID_PREFIX) else None


def _parse_echo(choice: Mapping[str, Any], n_prompt: int) -> _EchoedPrompt:
    """The first `n_prompt` positions of an echoed choice; TypeError/ValueError if the server did not echo."""
    lp = choice.get("logprobs")
    if not isinstance(lp, Mapping) or not isinstance(lp.get("token_logprobs"), list):
        raise TypeError("no echoed prompt log-probs in the response (logprobs.token_logprobs missing)")
    tokens, logprobs, top = lp.get("tokens") or [], lp["token_logprobs"], lp.get("top_logprobs") or []
    if len(tokens) < n_prompt or len(logprobs) < n_prompt or len(top) < n_prompt:
        raise ValueError(f"the server echoed {len(logprobs)} positions for a {n_prompt}-token prompt")
    return _EchoedPrompt(
        tokens=list(tokens[:n_prompt]), logprobs=list(logprobs[:n_prompt]), top=list(top[:n_prompt])
    )


def _check_echo(echo: _EchoedPrompt, ids: Sequence[int]) -> None:
    """The echo must be our prompt, position for position, with no log-prob at position 0."""
    for pos, (key, want) in enumerate(zip(echo.tokens, ids)):
        got = _token_id(key)
        if got is not None and got != want:
            raise ValueError(f"echoed token {got} at position {pos}, sent {want}")
    if echo.logprobs[0] is not None:
        raise ValueError(
            "the first prompt token carries a log-prob: echoed log-probs look shifted by one "
            "position (llama-cpp-python does this)"
        )


class OpenAIEngine:
    """Client for one OpenAI-compatible server; thread-pooled, retrying, results in request order."""

    def __init__(self, model: ResolvedModel, args: OpenAIArgs, *, api_key: str | None = None) -> None:
        self.args = args
        self.base_url = validate_base_url(args.base_url)
        self._model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        connect = min(10.0, args.timeout_s)
        self._client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(args.timeout_s, connect=connect),
            limits=httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency),
        )
        self._pool = ThreadPoolExecutor(max_workers=args.concurrency, thread_name_prefix="openai-engine")
        self._counter = 0  # numbers requests so each one's jitter stream is fixed by the seed
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._echo_ok: bool | None = args.echo
        try:
            self.served_model = args.served_model or self._discover_model()
        except BaseException:
            self.close()
            raise
        self.info = EngineInfo(
            name="openai",
            model=self.served_model,
            deterministic=False,
            details={
                "base_url": self.base_url,
                "served_model": self.served_model,
                "concurrency": str(args.concurrency),
                "max_retries": str(args.max_retries),
                "timeout_s": str(args.timeout_s),
            },
        )

    # -- transport -------------------------------------------------------------------------------

    def backoff_s(self, key: int, attempt: int) -> float:
        """Seconds to wait before retry `attempt` (0-based) of request `key`: exponential, capped,
        times a jitter factor in [0.5, 1) drawn from an RNG seeded by (seed, key, attempt)."""
        rng = random.Random(f"{self.args.seed}:{key}:{attempt}")
        return min(self.args.backoff_max_s, self.args.backoff_base_s * 2.0**attempt) * (
            0.5 + 0.5 * rng.random()
        )

    def _next_keys(self, n: int) -> range:
        with self._lock:
            start = self._counter
            self._counter += n
        return range(start, start + n)

    def _request(self, method: str, path: str, key: int, payload: Mapping[str, Any] | None = None) -> Any:
        """One call with retries; returns the decoded JSON or raises _Permanent / _Exhausted."""
        error = ""
        attempts = self.args.max_retries + 1
        for attempt in range(attempts):
            retry_after: float | None = None
            try:
                resp = self._client.request(method, path, json=payload)
            except httpx.TimeoutException:
                error = f"timed out after {self.args.timeout_s:g} s"
            except httpx.TransportError as exc:
                error = f"connection failed ({type(exc).__name__})"
            else:
                if resp.status_code == 200:
                    try:
                        return resp.json()
                    except ValueError:
                        error = "the server answered 200 with a body that is not JSON"
                elif resp.status_code in RETRY_STATUS:
                    error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                    retry_after = _retry_after_s(resp)
                else:
                    raise _Permanent(f"HTTP {resp.status_code}: {resp.text[:300]}")
            if attempt + 1 < attempts:
                wait = self.backoff_s(key, attempt)
                if retry_after is not None:
                    wait = max(wait, min(retry_after, self.args.backoff_max_s))
                log.info(
                    "request %d: %s; retry %d/%d in %.2f s",
                    key,
                    error,
                    attempt + 1,
                    self.args.max_retries,
                    wait,
                )
                time.sleep(wait)
        raise _Exhausted(f"{error} (gave up after {attempts} attempts)")

    def _completion(self, payload: Mapping[str, Any], key: int) -> Mapping[str, Any]:
        body = self._request("POST", "/completions", key, {"model": self.served_model, **payload})
        if not isinstance(body, Mapping) or not isinstance(body.get("choices"), list) or not body["choices"]:
            raise _Permanent("the response has no choices")
        return body

    def _map(self, fn: Callable[[T, int], Any], items: Sequence[T]) -> list[Any]:
        """Run fn(item, key) on the pool; results (or Failure) in item order."""
        keys = self._next_keys(len(items))

        def guarded(pair: tuple[T, int]) -> Any:
            try:
                return fn(*pair)
            except (_Permanent, _Exhausted, ValueError, KeyError, TypeError) as exc:
                return Failure(error=str(exc) or type(exc).__name__)

        return list(self._pool.map(guarded, zip(items, keys)))

    def _discover_model(self) -> str:
        try:
            body = self._request("GET", "/models", key=-1)
        except (_Permanent, _Exhausted) as exc:
            raise EngineError(
                f"cannot list models at {self.base_url}/models ({exc}); is the server up? Or set served_model"
            ) from None
        ids = (
            [m.get("id") for m in body.get("data", []) if isinstance(m, Mapping)]
            if isinstance(body, Mapping)
            else []
        )
        if len(ids) != 1 or not isinstance(ids[0], str):
            raise EngineError(
                f"the server at {self.base_url} serves {ids or 'no models'}; name one with served_model"
            )
        return ids[0]

    # -- tokenizer and echo capability -------------------------------------------------------------

    def _tok(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                source = self.args.tokenizer or self._model.load_id
                offline = os.environ.get("HF_HUB_OFFLINE", "1") not in ("0", "false", "False")
                try:
                    self._tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
                except OSError as exc:
                    raise EngineError(
                        f"cannot load tokenizer {source!r} for prompt log-probs: "
                        f"{str(exc).splitlines()[0]}; set tokenizer"
                    ) from None
            return self._tokenizer

    def _require_echo(self) -> None:
        """Probe once whether the server echoes prompt log-probs with token ids; EngineError if not."""
        if self._echo_ok is None:
            ids = list(self._tok().encode("The quick brown fox jumps over the lazy dog"))
            try:
                body = self._completion(_echo_payload([ids], top=1), key=-1)
                echo = _parse_echo(body["choices"][0], len(ids))
                _check_echo(echo, ids)
                self._echo_ok = True
            except _Exhausted as exc:  # retries exhausted: unreachable, not incapable; ask again later
                raise EngineError(
                    f"the echo probe to {self.base_url} failed ({exc}); is the server up?"
                ) from None
            except (_Permanent, ValueError, KeyError, TypeError) as exc:  # rejected or ignored echo
                log.warning("server at %s does not echo prompt log-probs: %s", self.base_url, exc)
                self._echo_ok = False
        if not self._echo_ok:
            raise EngineError(f"the server at {self.base_url} does not echo prompt log-probs; {NO_ECHO_HINT}")

    # -- the three request kinds -----------------------------------------------------------------

    def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult | Failure]:
        """Completions for each request (stop strings cut the text, as lm-eval's `until` does)."""

        def one(req: GenerateRequest, key: int) -> GenerateResult:
            payload: dict[str, Any] = {
                "prompt": req.prompt,
                "max_tokens": req.max_tokens,
                "temperature": req.temperature,
                "top_p": req.top_p,
            }
            if req.until:
                payload["stop"] = list(req.until)
            if req.seed is not None:
                payload["seed"] = req.seed
            body = self._completion(payload, key)
            choice = body["choices"][0]
            body_text = choice.get("text")
            if not isinstance(body_text, str):
                raise TypeError("the response choice has no text")
            text = cut_at_stop(body_text, req.until)
            usage = body.get("usage")
            counted = usage.get("completion_tokens") if isinstance(usage, Mapping) else None
            tokens = (
                counted
                if isinstance(counted, int)
                else len(self._tok().encode(text, add_special_tokens=False))
            )
            finish = "length" if choice.get("finish_reason") == "length" else "stop"
            return GenerateResult(text=text, output_tokens=tokens, finish_reason=finish)

        return self._map(one, requests)

    def loglikelihood(self, requests: list[LoglikelihoodRequest]) -> list[LoglikelihoodResult | Failure]:
        """Sum of continuation token log-probs per continuation (nats), and whether each is greedy."""
        if not requests:
            return []
        self._require_echo()
        tok = self._tok()
        # Tokenise here, on one thread: the pool only does I/O and parsing.
        encoded = [[encode_pair(tok, context, c) for context, c in req.pairs()] for req in requests]

        def one(pairs: list[tuple[list[int], list[int]]], key: int) -> LoglikelihoodResult:
            prompts = [ctx + cont for ctx, cont in pairs]
            body = self._completion(_echo_payload(prompts, top=1), key)
            choices = sorted(body["choices"], key=lambda c: c.get("index", 0))
            if len(choices) != len(prompts):
                raise ValueError(f"{len(choices)} choices for {len(prompts)} continuations")
            lls: list[float] = []
            greedy: list[bool] = []
            for (ctx, cont), ids, choice in zip(pairs, prompts, choices):
                echo = _parse_echo(choice, len(ids))
                _check_echo(echo, ids)
                total, is_greedy = 0.0, bool(cont)
                for pos in range(len(ctx), len(ids)):
                    lp, top = echo.logprobs[pos], echo.top[pos]
                    if lp is None or not top:
                        raise ValueError(f"no log-prob for prompt position {pos}")
                    total += float(lp)
                    is_greedy = is_greedy and float(lp) >= max(top.values())
                lls.append(total)
                greedy.append(is_greedy)
            return LoglikelihoodResult(loglikelihoods=tuple(lls), is_greedy=tuple(greedy))

        return self._map(one, encoded)

    def token_logprobs(self, requests: list[TokenLogprobsRequest]) -> list[TokenLogprobs | Failure]:
        """Teacher-forced top-k next-token distributions over each text (first `max_tokens` tokens)."""
        if not requests:
            return []
        self._require_echo()
        tok = self._tok()
        encoded = [(list(tok.encode(req.text))[: req.max_tokens], req.top_k) for req in requests]

        def one(job: tuple[list[int], int], key: int) -> TokenLogprobs:
            ids, top_k = job
            if len(ids) < 2:
                raise ValueError("the text has fewer than 2 tokens: nothing to predict")
            body = self._completion(_echo_payload([ids], top=top_k), key)
            echo = _parse_echo(body["choices"][0], len(ids))
            _check_echo(echo, ids)
            topk_ids: list[list[int]] = []
            topk_lps: list[list[float]] = []
            target_lps: list[float] = []
            for pos in range(1, len(ids)):  # position pos-1 predicts token pos
                lp, top = echo.logprobs[pos], echo.top[pos]
                if lp is None or not top:
                    raise ValueError(f"no log-probs for prompt position {pos}")
                ranked = sorted(top.items(), key=lambda kv: kv[1], reverse=True)[:top_k]
                keyed = [(_token_id(k), v) for k, v in ranked]
                if any(i is None for i, _ in keyed):
                    raise EngineError(
                        f"the server at {self.base_url} does not name tokens by id "
                        "(return_tokens_as_token_ids); token-distribution tasks need vLLM"
                    )
                topk_ids.append([int(i) for i, _ in keyed if i is not None])
                topk_lps.append([float(v) for _, v in keyed])
                target_lps.append(float(lp))
            return TokenLogprobs(
                target_ids=ids[1:], target_logprobs=target_lps, topk_ids=topk_ids, topk_logprobs=topk_lps
            )

        return self._map(one, encoded)

    def close(self) -> None:
        """Stop the worker threads and close the connections."""
        self._pool.shutdown(wait=True)
        self._client.close()


def _echo_payload(prompts: list[list[int]], *, top: int) -> dict[str, Any]:
    """Score prompts of token ids: echo them with their log-probs and the `top` alternatives.
    One token is generated (max_tokens 0 is not accepted everywhere) and ignored."""
    return {
        "prompt": prompts,
        "max_tokens": 1,
        "temperature": 0.0,
        "echo": True,
        "logprobs": top,
        "return_tokens_as_token_ids": True,
    }


def cut_at_stop(text: str, until: Sequence[str]) -> str:
    """Text up to the first occurrence of any stop string (servers usually cut already)."""
    cut = len(text)
    for stop in until:
        if stop:
            i = text.find(stop)
            if i != -1:
                cut = min(cut, i)
    return text[:cut]


def _retry_after_s(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def build(model: ResolvedModel, args: Mapping[str, Any]) -> OpenAIEngine:
    """The `openai` engine for `model` from its engine arguments (see OpenAIArgs)."""
    try:
        parsed = OpenAIArgs.model_validate(dict(args))
    except ValidationError as exc:
        err = first_error(exc)
        where = err.where_or("engine_args")
        hint = f"; {did_you_mean(where, OpenAIArgs.model_fields)}" if err.type == "extra_forbidden" else ""
        raise EngineError(f"openai engine argument {where}: {err.msg}{hint}") from None
    api_key = None
    if parsed.api_key_env:
        api_key = os.environ.get(parsed.api_key_env)
        if not api_key:
            raise EngineError(f"environment variable {parsed.api_key_env} (named by api_key_env) is not set")
    return OpenAIEngine(model, parsed, api_key=api_key)
