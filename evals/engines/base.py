"""The engine interface: typed requests in, results in request order out.

Three request kinds cover every task: free generation (GSM8K, MATH, GPQA-CoT, needle), scoring a
set of continuations by log-likelihood (multiple choice, LAMBADA), and teacher-forced next-token
distributions (WikiText-2 distribution checks). A request that fails is answered with
`Failure(error)` in its slot, never dropped and never turned into a wrong answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict


@dataclass(frozen=True)
class Message:
    """One chat message ("system" | "user" | "assistant") as a chat endpoint receives it."""

    role: str
    content: str


@dataclass(frozen=True)
class GenerateRequest:
    """Generate from `prompt` until a stop string or `max_tokens`. `prefix` (optional) is a leading
    part of `prompt` shared by many requests (the few-shot block) that an engine may cache.

    A chat request also carries `messages` (what a chat endpoint receives) and `chat_template_kwargs`;
    its `prompt` is those messages rendered with the model's own chat template, the text every
    text-prompt engine (hf, vllm, openai completions) tokenises. Sampling: `top_k` 0 and `min_p` 0
    mean off; `seed` is the per-sample seed both arms share (set when sampling)."""

    prompt: str
    until: tuple[str, ...] = ()
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    prefix: str | None = None
    messages: tuple[Message, ...] = ()
    chat_template_kwargs: tuple[tuple[str, str | int | float | bool], ...] = ()


@dataclass(frozen=True)
class LoglikelihoodRequest:
    """Score each continuation given `context`: sum of token log-probs of the continuation
    (tokenised as lm-eval does: context and continuation encoded together, split at the context).
    With `contexts` (one per continuation), continuation i is scored given `contexts[i]` instead:
    lm-eval's partial evaluation (Winogrande: several contexts, one shared continuation)."""

    context: str
    continuations: tuple[str, ...]
    prefix: str | None = None
    contexts: tuple[str, ...] = ()

    def pairs(self) -> list[tuple[str, str]]:
        """(context, continuation) for every continuation, in order."""
        if self.contexts:
            if len(self.contexts) != len(self.continuations):
                raise ValueError("contexts and continuations differ in length")
            return list(zip(self.contexts, self.continuations))
        return [(self.context, c) for c in self.continuations]


@dataclass(frozen=True)
class TokenLogprobsRequest:
    """Teacher-forced pass over `text`; return the top-k next-token distribution at each position.
    `max_tokens` caps the tokenised length (the chunk), `top_k` the stored alternatives.

    With `context` (a prompt), `text` is a continuation scored given it: context and text are
    tokenised together as a log-likelihood request is (lm-eval's split at the context), and only the
    positions predicting `text`'s tokens are returned (a reference answer, a fixed continuation)."""

    text: str
    top_k: int = 20
    max_tokens: int = 512
    context: str = ""


@dataclass(frozen=True)
class GenerateResult:
    """What an engine generated. `reasoning` is the reasoning part when the engine returned it
    separately (a vLLM server's `reasoning_content`); `text` is the rest."""

    text: str
    output_tokens: int
    finish_reason: str  # "stop" (stop string or EOS) | "length"
    reasoning: str | None = None
    prompt_tokens: int | None = None  # the prompt's token count, where the engine says
    cached_tokens: int | None = None  # prompt tokens served from the engine's prefix cache (None: not known)


@dataclass(frozen=True)
class LoglikelihoodResult:
    loglikelihoods: tuple[float, ...]  # one per continuation, natural log
    is_greedy: tuple[bool, ...]  # continuation equals the greedy tokens


class TokenLogprobs(BaseModel):
    """Teacher-forced next-token distribution summary for one text chunk (distribution probes), the
    result of a TokenLogprobsRequest; a sample record stores it as is (evals.records.samples).

    Position t predicts token t+1 of the chunk. `topk_ids[t]` / `topk_logprobs[t]` are the k most
    likely tokens at t (natural-log probabilities, descending); `target_logprobs[t]` is the
    log-probability of the actual next token.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    target_ids: list[int]
    target_logprobs: list[float]
    topk_ids: list[list[int]]
    topk_logprobs: list[list[float]]


@dataclass(frozen=True)
class Failure:
    """A request the engine could not answer (after its retries): scored None, counted as an error."""

    error: str


@dataclass(frozen=True)
class EngineInfo:
    """What a record and the report need to know about the engine that produced an arm."""

    name: str  # "hf" | "vllm" | "openai"
    model: str
    deterministic: bool  # bit-reproducible for the same inputs and seed
    details: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PrefixCacheStats:
    """Cumulative prefix-cache counters of one engine since it started (or since its counters were
    read): prompt tokens looked up and prompt tokens served from the cache. `source` says where the
    numbers come from ("vllm metrics", "server /metrics", "counted" by the hf engine)."""

    queried_tokens: int
    hit_tokens: int
    source: str

    @property
    def hit_rate(self) -> float | None:
        """hit_tokens / queried_tokens (None before any lookup)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else None


@runtime_checkable
class PrefixCacheControl(Protocol):
    """An engine with a prefix cache it can empty and count (the cache-path probe needs both)."""

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix: the next request is served cold."""
        ...

    def prefix_cache_stats(self) -> PrefixCacheStats:
        """The cumulative lookup and hit counters."""
        ...


@runtime_checkable
class Engine(Protocol):
    """Batched requests in, one result (or Failure) per request out, in request order."""

    info: EngineInfo

    def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult | Failure]: ...

    def loglikelihood(self, requests: list[LoglikelihoodRequest]) -> list[LoglikelihoodResult | Failure]: ...

    def token_logprobs(self, requests: list[TokenLogprobsRequest]) -> list[TokenLogprobs | Failure]: ...

    def close(self) -> None: ...
