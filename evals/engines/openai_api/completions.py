"""The `openai` engine's three request kinds over `/completions` (generation over `/chat/completions`
with `api = "chat"`: chat.py).

Generation is a plain completions call of the rendered prompt, or a chat call of its messages. A
sampling key the server would ignore (top_k, min_p on a server not known to honour them: sampling.py)
is refused with an EngineError before any request is sent. Log-likelihood and teacher-forced token
distributions use `echo` + `logprobs` on a prompt of token ids (tokenised locally with the model's
tokenizer, split as lm-eval splits context and continuation) and read the prompt tokens'
log-probabilities back, as lm-eval's `local-completions` does. A server that does not echo prompt log-probs (llama.cpp's server
ignores `echo`) is detected by a probe and refused for those tasks with an EngineError, never
answered with wrong numbers. A request that still fails after the client's retries is answered with
`base.Failure(error)` in its slot.

Against a vLLM server `qa run` started with a `kv` table (evals.servers.start), the engine reads the qa_kv
plugin's per-layer counts and the server's token counters at its start and at `close`, and checks them
(`kv_execution`, evals.engines.vllm.kv.server_counts); a count that does not match refuses the arm at close.
A server the toolkit did not start is not counted (`kv_execution` stays None).

With `load` (evals.engines.openai_api.load), every call's requests go out amid filler requests
(evals.engines.openai_api.load_run), the echo probe alone; what ran is `load_record`, at close.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import JsonValue

from evals.engines import base
from evals.engines.base import TokenLogprobs
from evals.engines.lmeval_tokens import PairTokenizer, encode_pair
from evals.engines.openai_api.args import OpenAIArgs
from evals.engines.openai_api.chat import NO_SCORING_HINT, chat_payload, check_chat_requests, parse_chat
from evals.engines.openai_api.client import ApiClient, RequestRejected, RetriesExhausted, api_key_from_env
from evals.engines.openai_api.load import FillerPrompt, ServedLoadRecord
from evals.engines.openai_api.load_metrics import MetricsSampler
from evals.engines.openai_api.load_run import ServedLoad
from evals.engines.openai_api.prefix_cache import ServerPrefixCache, response_tokens
from evals.engines.openai_api.sampling import ServerKind, check_sampling, kind_from_models, sampling_body
from evals.engines.stops import cut_at_stop
from evals.engines.vllm.kv.proof import refuse_unexecuted
from evals.engines.vllm.kv.record import KVExecution
from evals.engines.vllm.kv.server_counts import ServedWatch, is_counted
from evals.errors import EngineError
from evals.models.resolve import ResolvedModel
from evals.offline import hub_mode, hub_offline

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

TOKEN_ID_PREFIX = "token_id:"  # vLLM's `return_tokens_as_token_ids` spelling of a token
ECHO_PROBE_TEXT = "The quick brown fox jumps over the lazy dog"
NO_ECHO_HINT = (
    "log-likelihood and token-distribution tasks need a server that echoes prompt "
    "log-probs (vLLM, SGLang); llama.cpp's server ignores echo: run generative tasks there"
)


@dataclass(frozen=True)
class EchoedPrompt:
    """The server's echo of one prompt: per position, the token key, its log-prob (None at 0) and
    the top alternatives (token key -> log-prob)."""

    tokens: list[str]
    logprobs: list[float | None]
    top: list[dict[str, float] | None]


def token_id(key: str) -> int | None:
    """The id in a `token_id:N` token key; None for a key that is text."""
    return int(key[len(TOKEN_ID_PREFIX) :]) if key.startswith(TOKEN_ID_PREFIX) else None


def parse_echo(choice: Mapping[str, Any], n_prompt: int) -> EchoedPrompt:
    """The first `n_prompt` positions of an echoed choice; TypeError/ValueError if the server did not echo."""
    lp = choice.get("logprobs")
    if not isinstance(lp, Mapping) or not isinstance(lp.get("token_logprobs"), list):
        raise TypeError("no echoed prompt log-probs in the response (logprobs.token_logprobs missing)")
    tokens, logprobs, top = lp.get("tokens") or [], lp["token_logprobs"], lp.get("top_logprobs") or []
    if len(tokens) < n_prompt or len(logprobs) < n_prompt or len(top) < n_prompt:
        raise ValueError(f"the server echoed {len(logprobs)} positions for a {n_prompt}-token prompt")
    return EchoedPrompt(tokens=list(tokens[:n_prompt]), logprobs=list(logprobs[:n_prompt]),
                        top=list(top[:n_prompt]))


def check_echo(echo: EchoedPrompt, ids: Sequence[int]) -> None:
    """The echo must be our prompt, position for position, with no log-prob at position 0."""
    for pos, (key, want) in enumerate(zip(echo.tokens, ids)):
        got = token_id(key)
        if got is not None and got != want:
            raise ValueError(f"echoed token {got} at position {pos}, sent {want}")
    if echo.logprobs[0] is not None:
        raise ValueError(
            "the first prompt token carries a log-prob: echoed log-probs look shifted by one "
            "position (llama-cpp-python does this)"
        )


def echo_payload(prompts: list[list[int]], *, top: int) -> dict[str, JsonValue]:
    """Score prompts of token ids: echo them with their log-probs and the `top` alternatives.
    One token is generated (max_tokens 0 is not accepted everywhere) and ignored."""
    return {
        "prompt": prompts,  # type: ignore[dict-item]  # list[list[int]] is JSON
        "max_tokens": 1,
        "temperature": 0.0,
        "echo": True,
        "logprobs": top,
        "return_tokens_as_token_ids": True,
    }


class OpenAIEngine:
    """Completions, log-likelihoods and token distributions from one OpenAI-compatible server."""

    def __init__(self, model: ResolvedModel, args: OpenAIArgs, *, api_key: str | None = None,
                 tokenizer: PairTokenizer | None = None) -> None:
        self.args = args
        # under load the evaluated requests in flight are load.evaluated_slots (the fillers have their own client)
        self.client = ApiClient(args.model_copy(update={"concurrency": args.load.slots}) if args.load else args,
                                api_key=api_key)
        self.base_url = self.client.base_url
        self._model = model
        self._lock = threading.Lock()
        self._tokenizer: Any = tokenizer  # loaded on first use: generation needs none
        self._echo_ok: bool | None = args.echo
        self.kv_execution: KVExecution | None = None  # the qa_kv plugin's checked counts (a counted server), at close
        self.load: ServedLoad | None = None
        self.load_record: ServedLoadRecord | None = None  # what `load` sent and the server's counters, at close
        try:
            self.served_model = args.served_model or self.client.served_model()
            self.server_kind: ServerKind = args.server_kind or self._detect_kind()
            counted = len(self.client.replicas) == 1 and is_counted(self.base_url)
            self._kv_watch = ServedWatch.start(self.client.replicas[0].http, self.base_url) if counted else None
            if args.load is not None:
                http = self.client.replicas[0].http
                sampler = MetricsSampler.at(self.base_url, http.headers) if self.server_kind == "vllm" else None
                self.load = ServedLoad(args.load, args, served_model=self.served_model, kind=self.server_kind,
                                       api_key=api_key, note=self._watched, encode=self._encode, sampler=sampler)
        except BaseException:
            self.client.close()
            raise
        # the sessions probe's cold path (a reset) and hit counters: evals.engines.openai_api.prefix_cache
        self.prefix_cache = ServerPrefixCache(self.server_kind, self.client.base_urls,
                                              [r.http for r in self.client.replicas])
        self.info = base.EngineInfo(
            name="openai",
            model=self.served_model,
            deterministic=False,
            details={
                "base_url": self.base_url,
                "served_model": self.served_model,
                "api": args.api,
                "server": self.server_kind,
                "concurrency": str(self.client.args.concurrency),
                "max_retries": str(args.max_retries),
                "timeout_s": str(args.timeout_s),
            },
        )

    def tokenizer(self) -> Any:
        """The tokenizer prompts are tokenised with (`tokenizer`, else the arm's model), loaded once."""
        with self._lock:
            if self._tokenizer is None:
                from transformers import AutoTokenizer  # transformers: only for prompt log-probs

                source = self.args.tokenizer or self._model.load_id
                offline = hub_offline()
                try:
                    with hub_mode(offline):
                        self._tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
                except OSError as exc:
                    raise EngineError(
                        f"cannot load tokenizer {source!r} for prompt log-probs: "
                        f"{str(exc).splitlines()[0]}; set tokenizer"
                    ) from None
            return self._tokenizer

    def _detect_kind(self) -> ServerKind:
        """The server kind GET /models names by `owned_by` ("openai" when it names none we know)."""
        try:
            return kind_from_models(self.client.request("GET", "/models", key=-1))
        except (RequestRejected, RetriesExhausted) as exc:
            log.warning("cannot read the server kind off %s/models (%s); treating it as 'openai'", self.base_url, exc)
            return "openai"

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer().encode(text, add_special_tokens=False))

    def _map(self, fn: Callable[[T, int], R], items: Sequence[T],
             prompts: Sequence[FillerPrompt]) -> list[R | base.Failure]:
        """fn over items on the client's pool; under `load`, amid fillers drawn from `prompts` (the call's own)."""
        if self.load is None:
            return self.client.map(fn, items)
        return self.load.map(self.client, fn, items, prompts)

    def _count_tokens(self, text: str) -> int:
        """Tokens of generated text as the model's tokenizer splits it (when the server did not count)."""
        return len(self.tokenizer().encode(text, add_special_tokens=False))

    def _refuse_chat_scoring(self) -> None:
        if self.args.api == "chat":
            raise EngineError(f"{self.base_url}: {NO_SCORING_HINT}")

    def _completion(self, payload: Mapping[str, JsonValue], key: int) -> Mapping[str, Any]:
        return self._watched(self.client.completion(self.served_model, payload, key))

    def _watched(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """`body`, noted by the qa_kv count's watch when the server is counted (its stop strings)."""
        if self._kv_watch is not None:
            self._kv_watch.response(body)
        return body

    def _require_echo(self) -> None:
        """Probe once whether the server echoes prompt log-probs with token ids; EngineError if not."""
        if self._echo_ok is None:
            ids = list(self.tokenizer().encode(ECHO_PROBE_TEXT))
            try:
                body = self._completion(echo_payload([ids], top=1), key=-1)
                check_echo(parse_echo(body["choices"][0], len(ids)), ids)
                self._echo_ok = True
            except RetriesExhausted as exc:  # unreachable, not incapable: ask again later
                raise EngineError(
                    f"the echo probe to {self.base_url} failed ({exc}); is the server up?"
                ) from None
            except (RequestRejected, ValueError, KeyError, TypeError) as exc:  # rejected or ignored echo
                log.warning("server at %s does not echo prompt log-probs: %s", self.base_url, exc)
                self._echo_ok = False
        if not self._echo_ok:
            raise EngineError(f"the server at {self.base_url} does not echo prompt log-probs; {NO_ECHO_HINT}")

    # -- the three request kinds -----------------------------------------------------------------

    def generate(self, requests: list[base.GenerateRequest]) -> list[base.GenerateResult | base.Failure]:
        """Completions (or chat completions) for each request; stop strings cut the text, as
        lm-eval's `until` does. A key the server ignores is an EngineError before anything is sent."""
        check_sampling(self.server_kind, self.args.api, requests, self.base_url)
        if self.args.api == "chat":
            check_chat_requests(requests, self.base_url)

            def chat(req: base.GenerateRequest, key: int) -> base.GenerateResult:
                body = self._watched(self.client.chat(self.served_model, chat_payload(req, self.server_kind), key))
                return parse_chat(body, req, self._count_tokens)

            return self._map(chat, requests, [[{"role": m.role, "content": m.content} for m in req.messages]
                                              for req in requests])

        extras = self.prefix_cache.request_extras()

        def one(req: base.GenerateRequest, key: int) -> base.GenerateResult:
            payload: dict[str, JsonValue] = {"prompt": req.prompt, **sampling_body(self.server_kind, req, "completions"),
                                             **extras}
            body = self._completion(payload, key)
            choice = body["choices"][0]
            body_text = choice.get("text")
            if not isinstance(body_text, str):
                raise TypeError("the response choice has no text")
            text = cut_at_stop(body_text, req.until)
            usage = body.get("usage")
            counted = usage.get("completion_tokens") if isinstance(usage, Mapping) else None
            tokens = counted if isinstance(counted, int) else self._count_tokens(text)
            finish = "length" if choice.get("finish_reason") == "length" else "stop"
            prompt_tokens, cached = response_tokens(body)
            self.prefix_cache.count(prompt_tokens, cached)
            return base.GenerateResult(text=text, output_tokens=tokens, finish_reason=finish,
                                       prompt_tokens=prompt_tokens, cached_tokens=cached)

        return self._map(one, requests, [req.prompt for req in requests])

    def reset_prefix_cache(self) -> None:
        """Serve the next call cold: the server's reset endpoint, or llama.cpp's cache_prompt = false."""
        self.prefix_cache.reset()

    def prefix_cache_stats(self) -> base.PrefixCacheStats:
        """The server's prefix-cache counters (/metrics), else the responses' own cached-token numbers."""
        return self.prefix_cache.stats()

    def loglikelihood(self, requests: list[base.LoglikelihoodRequest]) -> list[base.LoglikelihoodResult | base.Failure]:
        """Sum of continuation token log-probs per continuation (nats), and whether each is greedy."""
        if not requests:
            return []
        self._refuse_chat_scoring()
        self._require_echo()
        tok = self.tokenizer()
        # Tokenise here, on one thread: the pool only does I/O and parsing.
        encoded = [[encode_pair(tok, context, c) for context, c in req.pairs()] for req in requests]

        def one(pairs: list[tuple[list[int], list[int]]], key: int) -> base.LoglikelihoodResult:
            prompts = [ctx + cont for ctx, cont in pairs]
            body = self._completion(echo_payload(prompts, top=1), key)
            choices = sorted(body["choices"], key=lambda c: c.get("index", 0))
            if len(choices) != len(prompts):
                raise ValueError(f"{len(choices)} choices for {len(prompts)} continuations")
            lls: list[float] = []
            greedy: list[bool] = []
            for (ctx, cont), ids, choice in zip(pairs, prompts, choices):
                echo = parse_echo(choice, len(ids))
                check_echo(echo, ids)
                total, is_greedy = 0.0, bool(cont)
                for pos in range(len(ctx), len(ids)):
                    lp, top = echo.logprobs[pos], echo.top[pos]
                    if lp is None or not top:
                        raise ValueError(f"no log-prob for prompt position {pos}")
                    total += float(lp)
                    is_greedy = is_greedy and float(lp) >= max(top.values())
                lls.append(total)
                greedy.append(is_greedy)
            return base.LoglikelihoodResult(loglikelihoods=tuple(lls), is_greedy=tuple(greedy))

        return self._map(one, encoded, [pairs[0][0] + pairs[0][1] for pairs in encoded if pairs])

    def _prompt_logprobs_missing(self) -> str | None:
        """Why this server cannot give prompt log-probs (the chat endpoint, no echo), or None when it can."""
        try:
            self._refuse_chat_scoring()
            self._require_echo()
        except EngineError as exc:
            return str(exc)
        return None

    def _scored_ids(self, tok: Any, req: base.TokenLogprobsRequest) -> tuple[list[int], int, int]:
        """(prompt ids, first scored position, top_k): the text from its second token, or with a context,
        context + continuation split as lm-eval's log-likelihood (only the continuation's positions)."""
        if not req.context:
            return list(tok.encode(req.text))[: req.max_tokens], 1, req.top_k
        ctx, cont = encode_pair(tok, req.context, req.text)
        return ctx + cont[: req.max_tokens], len(ctx), req.top_k

    def token_logprobs(self, requests: list[base.TokenLogprobsRequest]) -> list[TokenLogprobs | base.Failure]:
        """Teacher-forced top-k next-token distributions over each text (first `max_tokens` tokens), or over
        a continuation given its context; a server without prompt log-probs answers the continuations
        Failure("not available: ...") (a reference answer is beside its task) and refuses plain texts."""
        if not requests:
            return []
        missing = self._prompt_logprobs_missing()
        if missing is not None and all(req.context for req in requests):
            return [base.Failure(f"not available: {missing}")] * len(requests)
        if missing is not None:
            raise EngineError(missing)
        tok = self.tokenizer()
        encoded = [self._scored_ids(tok, req) for req in requests]

        def one(job: tuple[list[int], int, int], key: int) -> TokenLogprobs:
            ids, first, top_k = job
            if len(ids) <= first:
                raise ValueError("nothing to predict: the text has fewer than 2 tokens or the continuation none")
            body = self._completion(echo_payload([ids], top=top_k), key)
            echo = parse_echo(body["choices"][0], len(ids))
            check_echo(echo, ids)
            topk_ids: list[list[int]] = []
            topk_lps: list[list[float]] = []
            target_lps: list[float] = []
            for pos in range(first, len(ids)):  # position pos-1 predicts token pos
                lp, top = echo.logprobs[pos], echo.top[pos]
                if lp is None or not top:
                    raise ValueError(f"no log-probs for prompt position {pos}")
                ranked = sorted(top.items(), key=lambda kv: kv[1], reverse=True)[:top_k]
                keyed = [(token_id(k), v) for k, v in ranked]
                if any(i is None for i, _ in keyed):
                    raise EngineError(
                        f"the server at {self.base_url} does not name tokens by id "
                        "(return_tokens_as_token_ids); token-distribution tasks need vLLM"
                    )
                topk_ids.append([int(i) for i, _ in keyed if i is not None])
                topk_lps.append([float(v) for _, v in keyed])
                target_lps.append(float(lp))
            return TokenLogprobs(
                target_ids=ids[first:], target_logprobs=target_lps, topk_ids=topk_ids, topk_logprobs=topk_lps
            )

        return self._map(one, encoded, [ids for ids, _, _ in encoded])

    def close(self) -> None:
        """Stop the worker threads and close the connections; against a counted server, first read and check
        every layer's rewrite counts (`kv_execution`, fillers' tokens and failed attempts included), and then
        EngineError when they refuse the arm; under `load`, keep what it sent (`load_record`)."""
        watch, self._kv_watch = getattr(self, "_kv_watch", None), None
        load, self.load = getattr(self, "load", None), None
        try:
            if watch is not None:
                failed = self.client.failed_attempts + (load.failed_attempts if load is not None else 0)
                self.kv_execution = watch.finish(failed)
        finally:
            self.client.close()
            if load is not None:
                self.load_record = load.record()
                load.close()
        if watch is not None and self.kv_execution is not None:
            refuse_unexecuted(self.kv_execution)


def build(model: ResolvedModel, args: OpenAIArgs) -> OpenAIEngine:
    """The `openai` engine for `model` (the API key read from the variable `api_key_env` names)."""
    return OpenAIEngine(model, args, api_key=api_key_from_env(args))
