"""HFEngine: the Engine protocol over a transformers model, delegating each request kind to its
module (generation: `decode` or `fixed_batch`; log-likelihood: `score`; token log-probs: `logprobs`; with the
prefix cache on, generation and token log-probs go through `cached`).

Speed comes from batching (requests sorted by length, under a token budget), logits computed only
where they are read, caches that grow in place (no per-step concatenation), continuous batching
for generation and the shared few-shot prefix (`shared_prefix`). Models with sliding-window layers decode
in fixed left-padded batches instead (their caches have no row operations).
"""

from __future__ import annotations

from typing import Any

import torch

from evals.engines import base
from evals.engines.base import TokenLogprobs
from evals.engines.hf.args import HFEngineArgs
from evals.engines.hf.cached import cached_generate, cached_token_logprobs
from evals.engines.hf.decode import Member, generate_stream
from evals.engines.hf.fixed_batch import generate_batch
from evals.engines.hf.logprobs import token_logprobs
from evals.engines.hf.model import HFModel
from evals.engines.hf.prefix_cache import prefix_cache_for
from evals.engines.hf.request_batches import chunks, guarded, token_budget
from evals.engines.hf.score import loglikelihood
from evals.engines.hf.shared_prefix import PrefixKV, PrefixStore
from evals.errors import EngineError
from quant.scales.files import KVScales

PREFIX_CACHE_HINT = "set engine_args.kv.prefix_cache = { enabled = true }"


class HFEngine:
    """Batched transformers inference with an optional emulated quantized KV cache."""

    def __init__(self, model: Any, tokenizer: Any, args: HFEngineArgs, name: str,
                 scales: KVScales | None = None) -> None:
        self.hf = HFModel(model, tokenizer, args, scales)
        self.prefixes = PrefixStore(self.hf)
        self.prefix_cache = prefix_cache_for(self.hf)  # kv.prefix_cache: generate and token_logprobs read it
        self.tokenizer = tokenizer
        self.device = self.hf.device
        self.max_length = self.hf.max_length
        self.info = base.EngineInfo(
            name="hf",
            model=name,
            deterministic=self.device.type == "cpu",  # CPU kernels are bitwise reproducible; CUDA ones need not be
            details={
                "dtype": args.dtype,
                "device": args.device,
                "batch_size": str(args.batch_size),
                "max_length": str(self.max_length),
                "kv": "none" if args.kv is None else repr(args.kv),
                "prefix_reuse": str(args.prefix_reuse).lower(),
            },
        )

    @property
    def model(self) -> Any:
        """The transformers model (None after close)."""
        return self.hf.model

    @property
    def args(self) -> HFEngineArgs:
        """The engine arguments the next request reads."""
        return self.hf.args

    @args.setter
    def args(self, value: HFEngineArgs) -> None:
        self.hf.args = value

    def generate(self, requests: list[base.GenerateRequest]) -> list[base.GenerateResult | base.Failure]:
        """Greedy or seeded-sampled generation until a stop string, EOS or `max_tokens`."""
        hf = self.hf
        if self.prefix_cache is not None:
            return cached_generate(hf, self.prefix_cache, requests)
        out: list[base.GenerateResult | base.Failure | None] = [None] * len(requests)
        groups: dict[tuple[int, ...], list[Member]] = {}
        cached: dict[tuple[int, ...], PrefixKV | None] = {(): None}
        for i, req in enumerate(requests):
            if req.max_tokens < 1 or req.max_tokens >= hf.max_length:
                out[i] = base.Failure(f"max_tokens {req.max_tokens} must be in [1, {hf.max_length - 1}]")
                continue
            try:
                ids = hf.tokens.encode(req.prompt)[-(hf.max_length - req.max_tokens):]
                pre = self.prefixes.get(req.prefix)
            except Exception as exc:  # noqa: BLE001
                out[i] = base.Failure(f"{type(exc).__name__}: {exc}")
                continue
            key: tuple[int, ...] = ()
            if pre is not None and len(ids) > len(pre.ids) and tuple(ids[: len(pre.ids)]) == pre.ids:
                key = pre.ids
                cached[key] = pre
            groups.setdefault(key, []).append((i, ids))
        for key, members in groups.items():
            pre, cut = cached[key], len(key)
            # longest first (as lm-eval): estimates err high, memory errors show up at once
            members.sort(key=lambda m: (-len(m[1]), m[0]))
            if hf.rows_ok:
                for i, res in generate_stream(hf, requests, members, pre).items():
                    out[i] = res
                continue
            lengths = [len(ids) - cut + requests[i].max_tokens for i, ids in members]
            batches = chunks(members, token_budget(hf.args, lengths))

            def run(batch: list[Member], pre: PrefixKV | None = pre, cut: int = cut) -> list[base.GenerateResult]:
                return generate_batch(hf, [requests[i] for i, _ in batch], [ids[cut:] for _, ids in batch], pre)

            for batch, results in zip(batches, guarded(batches, run), strict=True):
                for (i, _), res in zip(batch, results, strict=True):
                    out[i] = res
        assert all(r is not None for r in out)
        return out  # type: ignore[return-value]

    def loglikelihood(self, requests: list[base.LoglikelihoodRequest]) -> list[base.LoglikelihoodResult | base.Failure]:
        """Sum of continuation token log-probs (natural log) per continuation, and greedy flags."""
        return loglikelihood(self.hf, self.prefixes, requests)

    def token_logprobs(self, requests: list[base.TokenLogprobsRequest]) -> list[TokenLogprobs | base.Failure]:
        """Top-k next-token log-probs and the actual next token's log-prob at every position."""
        if self.prefix_cache is not None:
            return cached_token_logprobs(self.hf, self.prefix_cache, requests)
        return token_logprobs(self.hf, requests)

    @property
    def prefix_cache_enabled(self) -> bool:
        """Whether the arm's kv spec turned the prefix cache on."""
        return self.prefix_cache is not None

    def reset_prefix_cache(self) -> None:
        """Forget every cached prompt: the next request is served cold (EngineError without a prefix cache)."""
        if self.prefix_cache is None:
            raise EngineError(f"hf engine: no prefix cache to reset; {PREFIX_CACHE_HINT}")
        self.prefix_cache.reset()

    def prefix_cache_stats(self) -> base.PrefixCacheStats:
        """Prompt tokens looked up and read from the prefix cache since the engine started (counted)."""
        if self.prefix_cache is None:
            raise EngineError(f"hf engine: no prefix cache to count; {PREFIX_CACHE_HINT}")
        return self.prefix_cache.stats()

    def close(self) -> None:
        """Drop the model, the cached prefixes and (on GPU) the allocator's cache."""
        self.prefixes.clear()
        if self.prefix_cache is not None:
            self.prefix_cache.reset()
        self.hf.model = self.hf.decoder = self.hf.head = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
