"""The `hf` engine: a transformers causal LM on CPU or GPU, with the emulated (quantized) KV cache.

Tokenisation follows lm-eval's HFLM (lm_eval/models/huggingface.py, api/model.py `_encode_pair`),
so per-item scores match lm-eval's hf model: a log-likelihood pair is encoded as context +
continuation together and split at the context's length (trailing context spaces move to the
continuation); generation left-pads, left-truncates the prompt to `max_length - max_tokens`, and
cuts the decoded text at the first stop string.

Speed comes from batching (requests sorted by length, under a token budget), logits computed only
where they are read, caches that grow in place (no per-step concatenation), continuous batching
for generation (each prompt is prefilled alone and unpadded, then joins the decoding batch in the
row of a finished sequence), and the shared few-shot prefix: its KV is computed once, held in the
same cache class as every other KV (so quantized exactly as the real cache would hold it), and
copied into each sequence. With prefix reuse the suffix reads the prefix from the cache, as a
serving engine with prefix caching does. Models with sliding-window layers decode in fixed
left-padded batches instead (their caches have no row operations).

Every forward pass gets a fresh cache from `HFEngine.new_cache`, the one place where the cache
class is chosen: the quantized cache when the arm has a `kv` spec, the plain one
(`quant.plain_cache`) when it has none.
"""

from __future__ import annotations

import copy
import inspect
import logging
import os
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
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
from evals.engines.lookup import PromptLookup
from evals.errors import EngineError
from evals.models import ResolvedModel, load_model
from evals.records import TokenLogprobs
from quant.validation import first_error

log = logging.getLogger(__name__)

DEFAULT_MAX_LENGTH = 2048  # lm-eval HFLM._DEFAULT_MAX_LENGTH, used when the config names no window
MAX_PREFIXES = 4  # few-shot prefixes whose KV is kept; one per task is the common case
STOP_WINDOW_EXTRA = 4  # tokens decoded beyond the longest stop string's length when checking for it
TRIM_MIN_POSITIONS = 64  # drop positions that are padding in every decoding row once there are this many
# tokens fed per speculative step (rows x (1 + drafts)): about where a step of this CPU turns from
# reading the weights to computing (a 16-row step with 4 drafts each took 1.6x a plain step)
DRAFT_TOKEN_BUDGET = 32
GQA_ENV = "TRANSFORMERS_SDPA_FORCE_GQA"  # read by transformers' sdpa_attention_forward at each call
LOGITS_BUDGET_BYTES = 1 << 30  # full-sequence logits held at once by token_logprobs (batch x len x vocab x 4 B)

R = TypeVar("R")
T = TypeVar("T")


class HFEngineArgs(BaseModel):
    """Engine arguments of the `hf` engine (one arm's `engine_args`); unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    batch_size: int = Field(default=16, ge=1)
    max_batch_tokens: int = Field(default=32768, ge=256)  # padded tokens per forward pass
    max_length: int | None = Field(default=None, ge=16)  # None: the model's context window
    prefill_chunk: int = Field(default=2048, ge=16)  # longer prompts are prefilled in chunks
    kv: dict[str, Any] | None = None  # KVQuantSpec fields; None: plain (unquantized) cache
    scales: Path | None = None  # static KV scales file (calibration output)
    prefix_reuse: bool = True
    # speculative greedy decoding: up to this many prompt-lookup draft tokens per step, verified in the
    # same forward pass (0: off; caches with a recent window always decode one token per step)
    draft_tokens: int = Field(default=4, ge=0, le=16)
    add_bos_token: bool | None = None  # None: the tokenizer's default, as lm-eval
    trust_remote_code: bool = False  # run the model repo's own Python: only when the spec says so


def parse_args(args: Mapping[str, Any]) -> HFEngineArgs:
    """Validate `hf` engine arguments; a bad key or value is a one-line EngineError."""
    try:
        return HFEngineArgs.model_validate(dict(args))
    except ValidationError as exc:
        err = first_error(exc)
        raise EngineError(f"hf engine: invalid argument {err.where_or('arguments')!r}: {err.msg}") from None


@dataclass
class _PrefixKV:
    """The cached KV of a shared prompt prefix (token ids, batch 1)."""

    ids: tuple[int, ...]
    cache: Any  # transformers Cache holding len(ids) positions

    def expand(self, n: int) -> Any:
        """A private copy of the cache repeated to batch size n."""
        cache = copy.deepcopy(self.cache)
        if n > 1:
            cache.batch_repeat_interleave(n)
        return cache


@dataclass
class _Row:
    """One sequence of a continuous-batching decode: its prefilled cache until it joins the batch, the
    token picked but not yet fed (at position `next_pos`), and the tokens generated so far."""

    cache: Any
    length: int  # positions in its cache after the prefill (prefix included)
    pending: int
    next_pos: int
    gen: torch.Generator | None
    window: int  # tokens decoded when checking for a stop string
    tokens: list[int] = field(default_factory=list)
    lookup: PromptLookup | None = None  # prompt and output so far, for draft tokens (greedy rows only)


@dataclass(frozen=True)
class _LLPiece:
    """One (context, continuation) pair of a LoglikelihoodRequest, tokenised."""

    req: int
    choice: int
    ctx: list[int]
    cont: list[int]


def _shortest_floats(values: torch.Tensor) -> list[float]:
    """float32 values as the shortest decimals that round-trip float32 (small, exact records)."""
    arr = values.detach().to("cpu", torch.float32).numpy()
    return [float(s) for s in arr.astype(str).ravel()]


def _chunks(seq: Sequence[T], sizes: Callable[[Sequence[T], int], int]) -> list[list[T]]:
    """Split `seq` into consecutive batches; `sizes(seq, start)` says how many to take at `start`."""
    out: list[list[T]] = []
    start = 0
    while start < len(seq):
        n = max(1, sizes(seq, start))
        out.append(list(seq[start : start + n]))
        start += n
    return out


class HFEngine:
    """Batched transformers inference with an optional emulated quantized KV cache."""

    def __init__(self, model: Any, tokenizer: Any, args: HFEngineArgs, name: str,
                 kv_spec: Any = None, scales: Any = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.args = args
        self.kv_spec = kv_spec
        self.scales = scales
        self.device = torch.device(args.device)
        self.max_length = args.max_length or _context_window(model.config, tokenizer)
        gen_eos = getattr(model.generation_config, "eos_token_id", None)
        eos: set[int] = set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_ids = frozenset(eos)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
        self.prefix_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self._bos_str = tokenizer.decode([self.prefix_token_id]) if self.prefix_token_id is not None else None
        self._prefixes: OrderedDict[tuple[int, ...], _PrefixKV] = OrderedDict()
        self._prefix_ids: dict[str, tuple[int, ...]] = {}
        # transformers >= 5.2x names the cache argument `cache`; older releases `past_key_values`
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        try:  # continuous batching needs a cache with row operations (full-attention layers only)
            probe = self.new_cache()
            self._rows_ok = bool(getattr(probe, "supports_rows", False))
            # draft tokens leave rejected positions in the cache, masked out: harmless unless a recent
            # window counts positions (it would then hold fewer real tokens than without drafts)
            self._drafts_ok = self._rows_ok and args.draft_tokens > 0 and all(
                getattr(getattr(getattr(layer, "k", None), "plan", None), "window", 0) == 0 for layer in probe.layers)
        except Exception:  # noqa: BLE001 - a spec that does not fit the model is reported by build()
            self._rows_ok = self._drafts_ok = False
        self._decoder, self._head = _split_head(model)
        self._split_head = self._decoder is not None
        if self._decoder is not None:
            dparams = inspect.signature(self._decoder.forward).parameters
            self._decoder_cache_kw = "cache" if "cache" in dparams else "past_key_values"
        self.info = EngineInfo(
            name="hf",
            model=name,
            deterministic=self.device.type == "cpu",  # CPU kernels are bitwise reproducible; CUDA ones need not be
            details={
                "dtype": args.dtype,
                "device": args.device,
                "batch_size": str(args.batch_size),
                "max_length": str(self.max_length),
                "kv": "none" if kv_spec is None else repr(kv_spec),
                "prefix_reuse": str(args.prefix_reuse).lower(),
            },
        )

    # -- the cache seam --------------------------------------------------------------------------

    def new_cache(self, padding_mask: torch.Tensor | None = None) -> Any:
        """A fresh, empty KV cache for one forward batch: quantized when the arm has a kv spec, else the
        plain growable cache (`quant.plain_cache`; transformers' DynamicCache for models it cannot describe).

        `padding_mask` ([batch, first-write tokens], 1 = real token) keeps pads out of dynamic scales."""
        if self.kv_spec is None:
            from quant.errors import QuantError
            from quant.plain_cache import make_plain_cache

            try:
                return make_plain_cache(self.model.config)
            except QuantError:  # a model our caches do not describe (e.g. encoder-decoder): transformers' own
                from transformers import DynamicCache

                return DynamicCache(config=self.model.config)
        from quant.kv_cache import make_cache

        cache = make_cache(self.model.config, self.kv_spec, self.scales)
        if padding_mask is not None:
            cache.set_padding_mask(padding_mask)
        return cache

    # -- tokenisation (lm-eval HFLM semantics) ---------------------------------------------------

    def tok_encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """Token ids of `text` as lm-eval's HFLM.tok_encode makes them."""
        kwargs: dict[str, bool] = {}
        if add_special_tokens is not None:
            kwargs["add_special_tokens"] = add_special_tokens
        elif self.args.add_bos_token is not None:
            kwargs["add_special_tokens"] = self.args.add_bos_token
        if add_special_tokens is None and self._bos_str and text.startswith(self._bos_str):
            kwargs["add_special_tokens"] = False
        return list(self.tokenizer.encode(text, **kwargs))

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids) as lm-eval's loglikelihood tokenises a pair."""
        if context == "":
            cont = self.tok_encode(continuation, add_special_tokens=False)
            if cont and self.prefix_token_id != cont[0]:
                return [self.prefix_token_id], cont
            return cont[:1], cont[1:]
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces > 0:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self.tok_encode(context + continuation)
        ctx = self.tok_encode(context)
        return ctx, whole[len(ctx):]

    def _prefix(self, prefix: str | None) -> _PrefixKV | None:
        """The cached KV of a few-shot prefix, computed on first use (None when reuse is off).

        The prefix's last token is left out of the cached part: it may merge with the text that
        follows it (e.g. "\\n\\n" + "Question"), so it is recomputed with each suffix."""
        if prefix is None or not self.args.prefix_reuse:
            return None
        ids = self._prefix_ids.get(prefix)
        if ids is None:
            if len(self._prefix_ids) >= 64:  # per-item prefixes would grow it without bound
                self._prefix_ids.clear()
            ids = self._prefix_ids[prefix] = tuple(self.tok_encode(prefix)[:-1])
        if len(ids) < 2 or len(ids) >= self.max_length // 2:
            return None
        if ids in self._prefixes:
            self._prefixes.move_to_end(ids)
            return self._prefixes[ids]
        cache = self.new_cache()
        with torch.inference_mode():
            self._forward(torch.tensor([ids], device=self.device), cache=cache, logits_to_keep=1)
        entry = _PrefixKV(ids=ids, cache=cache)
        self._prefixes[ids] = entry
        while len(self._prefixes) > MAX_PREFIXES:
            self._prefixes.popitem(last=False)
        return entry

    # -- model calls -----------------------------------------------------------------------------

    def _forward(self, input_ids: torch.Tensor, *, cache: Any, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None, logits_to_keep: int = 0) -> torch.Tensor:
        """Logits [batch, kept positions, vocab] of one forward pass that extends `cache`."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=logits_to_keep, **{self._cache_kw: cache})
        return out.logits

    def _span_logits(self, input_ids: torch.Tensor, spans: Sequence[tuple[int, int, int]], *, cache: Any,
                     attention_mask: torch.Tensor | None = None,
                     position_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Logits [length, vocab] at positions start..start+length-1 of each (row, start, length) span.

        When the model's logits are its output layer applied to the decoder's last hidden state
        (Llama, Qwen, Gemma with its soft cap, ...), only the spans' rows go through the output
        layer: for a 49k vocabulary that layer costs as much as the rest of a small model."""
        if self._split_head:
            out = self._decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                use_cache=True, **{self._decoder_cache_kw: cache})
            hidden = out.last_hidden_state  # [n, s, hidden]
            picked = torch.cat([hidden[r, a : a + n] for r, a, n in spans])  # [sum of lengths, hidden]
            logits = self._head(picked)
            cap = getattr(self.model.config, "final_logit_softcapping", None)
            if cap:
                logits = torch.tanh(logits / cap) * cap
            return list(torch.split(logits, [n for _, _, n in spans]))
        s = input_ids.shape[1]
        keep = s - min(a for _, a, _ in spans)
        logits = self._forward(input_ids, cache=cache, attention_mask=attention_mask, position_ids=position_ids,
                               logits_to_keep=keep)  # [n, keep, vocab]
        return [logits[r, a - (s - keep) : a - (s - keep) + n] for r, a, n in spans]

    def _batch_sizes(self, lengths: Sequence[int]) -> Callable[[Sequence[Any], int], int]:
        """Batch sizer for items sorted by descending length: batch_size, capped by the token budget."""

        def size(_seq: Sequence[Any], start: int) -> int:
            longest = max(1, lengths[start])
            return min(self.args.batch_size, max(1, self.args.max_batch_tokens // longest))

        return size

    def _guarded(self, batches: list[list[T]], run: Callable[[list[T]], list[R]]) -> list[list[R | Failure]]:
        """Run each batch; when a batch raises, run its items one by one and fail only the culprits."""
        results: list[list[R | Failure]] = []
        for batch in batches:
            try:
                results.append(list(run(batch)))
            except Exception as exc:  # noqa: BLE001 - one bad request must not sink its batch
                if len(batch) == 1:
                    results.append([Failure(f"{type(exc).__name__}: {exc}")])
                    continue
                log.warning("hf engine: a batch of %d failed (%s); retrying one by one", len(batch), exc)
                results.append([r for item in batch for r in self._guarded([[item]], run)[0]])
        return results

    # -- generation ------------------------------------------------------------------------------

    def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult | Failure]:
        """Greedy or seeded-sampled generation until a stop string, EOS or `max_tokens`."""
        out: list[GenerateResult | Failure | None] = [None] * len(requests)
        groups: dict[tuple[int, ...], list[tuple[int, list[int]]]] = {}
        prefixes: dict[tuple[int, ...], _PrefixKV | None] = {(): None}
        for i, req in enumerate(requests):
            if req.max_tokens < 1 or req.max_tokens >= self.max_length:
                out[i] = Failure(f"max_tokens {req.max_tokens} must be in [1, {self.max_length - 1}]")
                continue
            try:
                ids = self.tok_encode(req.prompt)[-(self.max_length - req.max_tokens):]
                pre = self._prefix(req.prefix)
            except Exception as exc:  # noqa: BLE001
                out[i] = Failure(f"{type(exc).__name__}: {exc}")
                continue
            key: tuple[int, ...] = ()
            if pre is not None and len(ids) > len(pre.ids) and tuple(ids[: len(pre.ids)]) == pre.ids:
                key = pre.ids
                prefixes[key] = pre
            groups.setdefault(key, []).append((i, ids))
        for key, members in groups.items():
            pre = prefixes[key]
            cut = len(key)
            # longest first (as lm-eval): estimates err high, memory errors show up at once
            members.sort(key=lambda m: (-len(m[1]), m[0]))
            lengths = [len(ids) - cut + requests[i].max_tokens for i, ids in members]
            if self._rows_ok:
                self._generate_stream(requests, members, pre, cut, max(lengths), out)
                continue
            batches = _chunks(members, self._batch_sizes(lengths))

            def run(batch: list[tuple[int, list[int]]], pre: _PrefixKV | None = pre,
                    cut: int = cut) -> list[GenerateResult]:
                return self._generate_batch([requests[i] for i, _ in batch], [ids[cut:] for _, ids in batch], pre)

            for batch, results in zip(batches, self._guarded(batches, run), strict=True):
                for (i, _), res in zip(batch, results, strict=True):
                    out[i] = res
        assert all(r is not None for r in out)
        return out  # type: ignore[return-value]

    # -- continuous batching: one prefill per sequence, finished rows refilled from the queue ------

    @torch.inference_mode()
    def _prefill_row(self, req: GenerateRequest, ids: list[int], pre: _PrefixKV | None,
                     gen: torch.Generator | None) -> _Row:
        """Prefill one prompt (after the cached prefix) unpadded, and pick its first token."""
        p = len(pre.ids) if pre is not None else 0
        cache = pre.expand(1) if pre is not None else self.new_cache()
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        step = self.args.prefill_chunk
        for start in range(0, len(ids), step):
            end = min(len(ids), start + step)
            pos = torch.arange(p + start, p + end, device=self.device)[None, :]
            logits = self._forward(x[:, start:end], cache=cache, position_ids=pos, logits_to_keep=1)
        first = self._pick(logits[:, -1, :].float(), [req], [gen])[0]
        return _Row(cache=cache, length=p + len(ids), pending=first, next_pos=p + len(ids), gen=gen,
                    window=max((len(u) for u in req.until), default=0) + STOP_WINDOW_EXTRA)

    def _row_done(self, req: GenerateRequest, row: _Row) -> GenerateResult | None:
        """Take the row's pending token; the result when the sequence is finished, else None."""
        tok = row.pending
        row.tokens.append(tok)
        if tok in self.eos_ids:
            return self._finish(req, row.tokens[:-1], len(row.tokens), "stop")
        if req.until and self._has_stop(row.tokens, req.until, row.window):
            return self._finish(req, row.tokens, len(row.tokens), "stop")
        if len(row.tokens) >= req.max_tokens:
            return self._finish(req, row.tokens, len(row.tokens), "length")
        return None

    def _generate_stream(self, requests: list[GenerateRequest], members: list[tuple[int, list[int]]],
                         pre: _PrefixKV | None, cut: int, longest: int,
                         out: list[GenerateResult | Failure | None]) -> None:
        """Generate for `members` (sorted longest first) with at most `width` sequences decoding at once.

        Each prompt is prefilled alone and unpadded (faster on CPU than a padded batch, and no causal
        work on padding), then joined to the decoding batch right-aligned: a shorter sequence is
        left-padded with masked zeros, a finished sequence's row is overwritten by the next prompt, and
        positions that are padding for every row are dropped. On an error the unfinished requests are
        run again one by one, so only a failing request fails."""
        width = min(self.args.batch_size, max(1, self.args.max_batch_tokens // max(1, longest)))
        try:
            self._stream(requests, deque(members), pre, cut, width, out)
        except Exception as exc:  # noqa: BLE001 - fall back to one request at a time
            rest = [m for m in members if out[m[0]] is None]
            log.warning("hf engine: batched decoding failed (%s); running %d requests one by one", exc, len(rest))
            for m in rest:
                req, ids = requests[m[0]], m[1][cut:]
                res = self._guarded([[m]], lambda b, req=req, ids=ids: self._generate_batch([req], [ids], pre))
                out[m[0]] = res[0][0]

    @torch.inference_mode()
    def _stream(self, requests: list[GenerateRequest], queue: deque[tuple[int, list[int]]],
                pre: _PrefixKV | None, cut: int, width: int, out: list[GenerateResult | Failure | None]) -> None:
        """The continuous-batching loop of `_generate_stream`: results go into `out` by request index."""
        dev = self.device
        live: list[tuple[int, _Row]] = []  # (request index, row), in cache row order

        def admit() -> tuple[int, _Row] | None:
            """The next queued request, prefilled; None when the queue is empty. Requests that finish
            (or fail) at their first token are recorded and skipped."""
            while queue:
                i, ids = queue.popleft()
                req = requests[i]
                gen = None
                if req.temperature > 0:
                    gen = torch.Generator(device=dev)
                    gen.manual_seed(req.seed if req.seed is not None else 0)
                try:
                    row = self._prefill_row(req, ids[cut:], pre, gen)
                except Exception as exc:  # noqa: BLE001 - one bad request must not sink the others
                    out[i] = Failure(f"{type(exc).__name__}: {exc}")
                    continue
                done = self._row_done(req, row)
                if done is not None:
                    out[i] = done
                    continue
                if self._drafts_ok and gen is None:
                    row.lookup = PromptLookup([*ids, *row.tokens])
                return i, row
            return None

        first = [r for r in (admit() for _ in range(width)) if r is not None]
        if not first:
            return
        t = max(row.length for _, row in first)
        for _, row in first:
            row.cache.pad_left(t - row.length)
        cache = type(first[0][1].cache).stack([row.cache for _, row in first])
        mask = torch.tensor([[0] * (t - row.length) + [1] * row.length for _, row in first], dtype=torch.long)
        live.extend(first)
        for _, row in live:
            row.cache = None  # its tensors now live in the batch cache
        mask = mask.to(dev)
        while live:
            k = min(self.args.draft_tokens, DRAFT_TOKEN_BUDGET // len(live) - 1)  # drafts per row this step
            drafts = [self._draft(requests[i], row, k) for i, row in live]
            if any(drafts):
                mask, free = self._speculative_step(requests, live, drafts, cache, mask, out)
            else:
                tokens = torch.tensor([[row.pending] for _, row in live], dtype=torch.long, device=dev)
                pos = torch.tensor([[row.next_pos] for _, row in live], dtype=torch.long, device=dev)
                mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
                logits = self._forward(tokens, cache=cache, attention_mask=mask, position_ids=pos,
                                       logits_to_keep=1)[:, -1, :].float()
                picked = self._pick(logits, [requests[i] for i, _ in live], [row.gen for _, row in live])
                free = []
                for b, (i, row) in enumerate(live):
                    row.pending, row.next_pos = picked[b], row.next_pos + 1
                    done = self._row_done(requests[i], row)
                    if done is not None:
                        out[i] = done
                        free.append(b)
                    elif row.lookup is not None:
                        row.lookup.extend([row.pending])
            while free and queue:  # refill finished rows
                nxt = admit()
                if nxt is None:
                    break
                b = free.pop(0)
                i, row = nxt
                t = mask.shape[1]
                if row.length > t:  # longer than the batch so far: make room on the left
                    cache.pad_left(row.length - t)
                    mask = torch.cat([mask.new_zeros((len(live), row.length - t)), mask], dim=1)
                    t = row.length
                row.cache.pad_left(t - row.length)
                cache.set_row(b, row.cache)
                row.cache = None
                mask[b] = 0
                mask[b, t - row.length:] = 1
                live[b] = (i, row)
            if free:  # nothing left to refill them with: drop the rows
                keep = [b for b in range(len(live)) if b not in set(free)]
                if not keep:
                    break
                idx = torch.tensor(keep, dtype=torch.long, device=dev)
                cache.batch_select_indices(idx)
                mask = mask[idx]
                live[:] = [live[b] for b in keep]
            lead = int((mask.cumsum(dim=1) == 0).sum(dim=1).min())  # positions that are padding in every row
            if lead >= TRIM_MIN_POSITIONS:
                cache.drop_oldest(lead)
                mask = mask[:, lead:]

    @staticmethod
    def _draft(req: GenerateRequest, row: _Row, k: int) -> list[int]:
        """Up to k prompt-lookup draft tokens to follow the row's pending token ([] for sampled rows,
        and no more than the row can use before reaching max_tokens)."""
        if row.lookup is None:
            return []
        return row.lookup.draft(min(k, req.max_tokens - len(row.tokens) - 1))

    def _speculative_step(self, requests: list[GenerateRequest], live: list[tuple[int, _Row]],
                          drafts: list[list[int]], cache: Any, mask: torch.Tensor,
                          out: list[GenerateResult | Failure | None]) -> tuple[torch.Tensor, list[int]]:
        """One decoding step that feeds each row's pending token and its draft tokens (rows padded
        to the longest draft) and keeps, per greedy row, the drafts that greedy decoding confirms
        plus the token greedy picks after them; a sampled row takes one token as in a plain step.
        Rejected and padding positions stay in the cache, masked out. Returns the extended mask and
        the batch rows whose sequence finished."""
        dev = self.device
        m = 1 + max(len(d) for d in drafts)
        fill = self.pad_id
        tokens = torch.tensor([[row.pending, *d] + [fill] * (m - 1 - len(d)) for (_, row), d in zip(live, drafts)],
                              dtype=torch.long, device=dev)
        pos = torch.tensor([[row.next_pos + j for j in range(m)] for _, row in live], dtype=torch.long, device=dev)
        new = torch.tensor([[1] * (1 + len(d)) + [0] * (m - 1 - len(d)) for d in drafts], dtype=mask.dtype,
                           device=dev)
        mask = torch.cat([mask, new], dim=1)
        with _gqa_sdpa():
            logits = self._span_logits(tokens, [(b, 0, 1 + len(d)) for b, d in enumerate(drafts)], cache=cache,
                                       attention_mask=mask, position_ids=pos)  # per row [1 + len(d), vocab]
        free: list[int] = []
        for b, ((i, row), d) in enumerate(zip(live, drafts)):
            req = requests[i]
            if row.gen is not None:  # sampled: one token from the first position, with the row's generator
                emit = self._pick(logits[b][:1].float(), [req], [row.gen])
            else:
                greedy = logits[b].float().argmax(dim=-1).tolist()  # greedy[j]: the token after input j
                a = 0
                while a < len(d) and d[a] == greedy[a]:
                    a += 1
                emit = [*d[:a], greedy[a]]
            done = None
            for tok in emit:
                row.pending = tok
                done = self._row_done(req, row)
                if done is not None:
                    break
            if done is not None:
                out[i] = done
                free.append(b)
                continue
            row.next_pos += len(emit)
            mask[b, mask.shape[1] - m + len(emit):] = 0  # rejected drafts and padding
            if row.lookup is not None:
                row.lookup.extend(emit)
        return mask, free

    @torch.inference_mode()
    def _generate_batch(self, reqs: list[GenerateRequest], prompts: list[list[int]],
                        pre: _PrefixKV | None) -> list[GenerateResult]:
        """Generate for one fixed batch (models with sliding-window layers, and the one-by-one fallback):
        left-padded prompts after an optional cached prefix; finished rows leave the batch."""
        n, p = len(prompts), (len(pre.ids) if pre is not None else 0)
        s = max(len(x) for x in prompts)
        dev = self.device
        input_ids = torch.full((n, s), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, p + s), dtype=torch.long)
        mask[:, :p] = 1
        for row, ids in enumerate(prompts):
            input_ids[row, s - len(ids):] = torch.tensor(ids, dtype=torch.long)
            mask[row, p + s - len(ids):] = 1
        # positions continue after the prefix and skip the pads between prefix and prompt
        pos = mask[:, p:].cumsum(-1) - 1 + p  # [n, s]
        pos.masked_fill_(mask[:, p:] == 0, 1)
        input_ids, mask, pos = input_ids.to(dev), mask.to(dev), pos.to(dev)
        step = self.args.prefill_chunk
        cache = pre.expand(n) if pre is not None else self.new_cache(mask[:, : min(s, step)])
        for start in range(0, s, step):
            end = min(s, start + step)
            logits = self._forward(input_ids[:, start:end], cache=cache, attention_mask=mask[:, : p + end],
                                   position_ids=pos[:, start:end], logits_to_keep=1)
        last = logits[:, -1, :].float()  # [n, vocab]
        next_pos = pos[:, -1] + 1  # [n]

        gens: list[torch.Generator | None] = []
        for req in reqs:
            if req.temperature > 0:
                g = torch.Generator(device=dev)
                g.manual_seed(req.seed if req.seed is not None else 0)
                gens.append(g)
            else:
                gens.append(None)
        windows = [max((len(u) for u in req.until), default=0) + STOP_WINDOW_EXTRA for req in reqs]
        tokens: list[list[int]] = [[] for _ in reqs]
        results: list[GenerateResult | None] = [None] * n
        rows = list(range(n))  # request index of each live batch row
        while rows:
            picked = self._pick(last, [reqs[i] for i in rows], [gens[i] for i in rows])
            keep: list[int] = []
            for b, i in enumerate(rows):
                tok = picked[b]
                tokens[i].append(tok)
                req = reqs[i]
                if tok in self.eos_ids:
                    results[i] = self._finish(req, tokens[i][:-1], len(tokens[i]), "stop")
                elif req.until and self._has_stop(tokens[i], req.until, windows[i]):
                    results[i] = self._finish(req, tokens[i], len(tokens[i]), "stop")
                elif len(tokens[i]) >= req.max_tokens:
                    results[i] = self._finish(req, tokens[i], len(tokens[i]), "length")
                else:
                    keep.append(b)
            if not keep:
                break
            if len(keep) < len(rows):
                idx = torch.tensor(keep, dtype=torch.long, device=dev)
                cache.batch_select_indices(idx)
                mask, next_pos = mask[idx], next_pos[idx]
                picked_t = torch.tensor([picked[b] for b in keep], dtype=torch.long, device=dev)
                rows = [rows[b] for b in keep]
            else:
                picked_t = torch.tensor(picked, dtype=torch.long, device=dev)
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            last = self._forward(picked_t[:, None], cache=cache, attention_mask=mask,
                                 position_ids=next_pos[:, None], logits_to_keep=1)[:, -1, :].float()
            next_pos = next_pos + 1
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    @staticmethod
    def _pick(logits: torch.Tensor, reqs: list[GenerateRequest], gens: list[torch.Generator | None]) -> list[int]:
        """Next token per row: argmax (first index on ties) or a draw from the row's own generator."""
        picked = logits.argmax(dim=-1).tolist()
        for b, (req, g) in enumerate(zip(reqs, gens, strict=True)):
            if g is None:
                continue
            row = logits[b] / req.temperature  # [vocab]
            if req.top_p < 1.0:
                # top-p as transformers' TopPLogitsWarper: drop the low tail whose mass is <= 1 - top_p
                sorted_logits, order = torch.sort(row, descending=False)
                cum = sorted_logits.softmax(-1).cumsum(-1)
                drop = cum <= (1 - req.top_p)
                drop[-1] = False
                row = row.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
            probs = row.softmax(-1)
            picked[b] = int(torch.multinomial(probs, 1, generator=g).item())
        return picked

    def _has_stop(self, tokens: list[int], until: tuple[str, ...], window: int) -> bool:
        tail = self.tokenizer.decode(tokens[-window:], skip_special_tokens=True)
        return any(u and u in tail for u in until)

    def _finish(self, req: GenerateRequest, tokens: list[int], count: int,
                reason: Literal["stop", "length"]) -> GenerateResult:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        for u in req.until:  # lm-eval postprocess_generated_text: cut at the first stop string
            if u:
                text = text.split(u)[0]
        return GenerateResult(text=text, output_tokens=count, finish_reason=reason)

    # -- log-likelihood --------------------------------------------------------------------------

    def loglikelihood(self, requests: list[LoglikelihoodRequest]) -> list[LoglikelihoodResult | Failure]:
        """Sum of continuation token log-probs (natural log) per continuation, and greedy flags.

        With reuse on, a request with several continuations that share one tokenised context (any
        non-empty context, as lm-eval splits pairs) has that context prefilled once and its
        continuations read it from the cache (for a quantized cache: stored, with dynamic scales
        from the context, as a serving engine with prefix caching holds it). Otherwise each
        (context, continuation) pair is one row, as in lm-eval."""
        failures: dict[int, Failure] = {}
        groups: dict[tuple[int, ...], list[_LLPiece]] = {}  # per-pair rows, by cached prefix
        shared: dict[tuple[int, ...], list[list[_LLPiece]]] = {}  # whole requests, by cached prefix
        prefixes: dict[tuple[int, ...], _PrefixKV | None] = {(): None}
        for r, req in enumerate(requests):
            try:
                pre = self._prefix(req.prefix)
                pieces = [_LLPiece(r, c, *self.encode_pair(context, cont))
                          for c, (context, cont) in enumerate(req.pairs())]
            except Exception as exc:  # noqa: BLE001
                failures[r] = Failure(f"{type(exc).__name__}: {exc}")
                continue
            if not req.continuations or any(not pc.cont for pc in pieces):
                failures[r] = Failure("every continuation must be non-empty after tokenisation")
                continue
            ctx = pieces[0].ctx
            fits = all(len(pc.ctx) + len(pc.cont) <= self.max_length + 1 for pc in pieces)  # no left truncation
            key: tuple[int, ...] = ()
            if pre is not None and fits and all(len(pc.ctx) > len(pre.ids) and tuple(pc.ctx[: len(pre.ids)]) == pre.ids
                                                for pc in pieces):
                key = pre.ids
                prefixes[key] = pre
            if (self.args.prefix_reuse and len(pieces) > 1 and req.context and fits and len(ctx) - 1 > len(key)
                    and all(pc.ctx == ctx for pc in pieces)):
                shared.setdefault(key, []).append(pieces)
            else:
                for pc in pieces:
                    groups.setdefault(key, []).append(pc)
        scored: dict[tuple[int, int], tuple[float, bool] | Failure] = {}
        for key, pieces in groups.items():
            pre, cut = prefixes[key], len(key)
            pieces.sort(key=lambda pc: (-(len(pc.ctx) + len(pc.cont)), tuple(pc.ctx + pc.cont)))
            lengths = [min(len(pc.ctx) + len(pc.cont) - 1, self.max_length) - cut for pc in pieces]
            batches = _chunks(pieces, self._batch_sizes(lengths))

            def run(batch: list[_LLPiece], pre: _PrefixKV | None = pre, cut: int = cut) -> list[tuple[float, bool]]:
                return self._loglikelihood_batch(batch, pre, cut)

            for batch, results in zip(batches, self._guarded(batches, run), strict=True):
                for pc, res in zip(batch, results, strict=True):
                    scored[(pc.req, pc.choice)] = res
        for key, reqs in shared.items():
            pre, cut = prefixes[key], len(key)
            reqs.sort(key=lambda ps: (-len(ps[0].ctx), ps[0].req))
            req_batches = _chunks(reqs, self._shared_sizes(reqs, cut))

            def run_shared(batch: list[list[_LLPiece]], pre: _PrefixKV | None = pre,
                           cut: int = cut) -> list[list[tuple[float, bool]]]:
                return self._loglikelihood_shared(batch, pre, cut)

            for batch, results in zip(req_batches, self._guarded(req_batches, run_shared), strict=True):
                for ps, res in zip(batch, results, strict=True):
                    for pc in ps:
                        scored[(pc.req, pc.choice)] = res if isinstance(res, Failure) else res[pc.choice]
        out: list[LoglikelihoodResult | Failure] = []
        for r, req in enumerate(requests):
            if r in failures:
                out.append(failures[r])
                continue
            parts = [scored[(r, c)] for c in range(len(req.continuations))]
            bad = next((p for p in parts if isinstance(p, Failure)), None)
            if bad is not None:
                out.append(bad)
                continue
            out.append(LoglikelihoodResult(loglikelihoods=tuple(p[0] for p in parts),  # type: ignore[index]
                                           is_greedy=tuple(p[1] for p in parts)))  # type: ignore[index]
        return out

    def _shared_sizes(self, reqs: list[list[_LLPiece]], cut: int) -> Callable[[Sequence[Any], int], int]:
        """Batch sizer for shared-context requests (sorted by descending context length): at most
        batch_size contexts, max_batch_tokens context tokens, and continuation logits within budget."""
        vocab = int(self.model.config.vocab_size)

        def size(_seq: Sequence[Any], start: int) -> int:
            longest_ctx = max(1, len(reqs[start][0].ctx) - cut)
            n = rows = longest_cont = 0
            for ps in reqs[start : start + self.args.batch_size]:
                rows += len(ps)
                longest_cont = max(longest_cont, *(len(pc.cont) for pc in ps))
                if n and ((n + 1) * longest_ctx > self.args.max_batch_tokens
                          or rows * longest_cont * vocab * 4 > LOGITS_BUDGET_BYTES):
                    break
                n += 1
            return n

        return size

    @torch.inference_mode()
    def _loglikelihood_shared(self, batch: list[list[_LLPiece]], pre: _PrefixKV | None,
                              cut: int) -> list[list[tuple[float, bool]]]:
        """Prefill each request's context (minus its last token) once, then score every continuation
        as [last context token] + continuation[:-1] on a copy of that request's cache rows."""
        n = len(batch)
        ctx_in = [ps[0].ctx[cut:-1] for ps in batch]  # non-empty: the caller checked len(ctx) - 1 > cut
        s1 = max(len(x) for x in ctx_in)
        ids1 = torch.full((n, s1), self.pad_id, dtype=torch.long)
        real1 = torch.zeros((n, s1), dtype=torch.long)
        for i, x in enumerate(ctx_in):
            ids1[i, : len(x)] = torch.tensor(x, dtype=torch.long)
            real1[i, : len(x)] = 1
        mask1 = torch.cat([torch.ones((n, cut), dtype=torch.long), real1], dim=1)  # [n, cut + s1]
        pos1 = (cut + torch.arange(s1)).expand(n, s1)
        cache = pre.expand(n) if pre is not None else self.new_cache(real1)
        dev = self.device
        self._forward(ids1.to(dev), cache=cache, attention_mask=mask1.to(dev), position_ids=pos1.to(dev),
                      logits_to_keep=1)
        rows = [(i, pc) for i, ps in enumerate(batch) for pc in ps]
        index = torch.tensor([i for i, _ in rows], dtype=torch.long)
        cache.batch_select_indices(index.to(dev))  # one cache row per continuation
        inputs = [[pc.ctx[-1], *pc.cont[:-1]] for _, pc in rows]
        s2 = max(len(x) for x in inputs)
        ids2 = torch.full((len(rows), s2), self.pad_id, dtype=torch.long)
        real2 = torch.zeros((len(rows), s2), dtype=torch.long)
        for j, x in enumerate(inputs):
            ids2[j, : len(x)] = torch.tensor(x, dtype=torch.long)
            real2[j, : len(x)] = 1
        # the pads after a short context stay masked; each continuation's positions follow its context
        mask2 = torch.cat([mask1[index], real2], dim=1)  # [rows, cut + s1 + s2]
        pos2 = torch.tensor([len(pc.ctx) - 1 for _, pc in rows])[:, None] + torch.arange(s2)[None, :]
        spans = [(j, 0, len(pc.cont)) for j, (_, pc) in enumerate(rows)]
        logits = self._span_logits(ids2.to(dev), spans, cache=cache, attention_mask=mask2.to(dev),
                                   position_ids=pos2.to(dev))
        out: list[list[tuple[float, bool]]] = [[] for _ in batch]
        for j, (i, pc) in enumerate(rows):
            lp = torch.log_softmax(logits[j].float(), dim=-1)  # [cont, vocab]
            cont = torch.tensor(pc.cont, dtype=torch.long, device=lp.device)
            out[i].append((float(lp.gather(1, cont[:, None]).sum()), bool((lp.argmax(dim=-1) == cont).all())))
        return out

    @torch.inference_mode()
    def _loglikelihood_batch(self, batch: list[_LLPiece], pre: _PrefixKV | None, cut: int) -> list[tuple[float, bool]]:
        """Score one right-padded batch; logits only from the first continuation position on."""
        inputs: list[list[int]] = []
        starts: list[int] = []  # index (in the row's input) of the logit predicting cont[0]
        for pc in batch:
            whole = (pc.ctx + pc.cont)[-(self.max_length + 1):][:-1][cut:]
            inputs.append(whole)
            starts.append(len(whole) - len(pc.cont))
        s = max(len(x) for x in inputs)
        ids = torch.full((len(batch), s), self.pad_id, dtype=torch.long)
        for row, x in enumerate(inputs):
            ids[row, : len(x)] = torch.tensor(x, dtype=torch.long)
        real = (torch.arange(s)[None, :] < torch.tensor([len(x) for x in inputs])[:, None]).long()  # [n, s]
        cache = pre.expand(len(batch)) if pre is not None else self.new_cache(real)
        # right padding: pads come after every real token, so causal attention never sees them
        spans = [(row, starts[row], len(pc.cont)) for row, pc in enumerate(batch)]
        logits = self._span_logits(ids.to(self.device), spans, cache=cache)
        out: list[tuple[float, bool]] = []
        for row, pc in enumerate(batch):
            lp = torch.log_softmax(logits[row].float(), dim=-1)  # [cont, vocab]
            cont = torch.tensor(pc.cont, dtype=torch.long, device=lp.device)
            greedy = bool((lp.argmax(dim=-1) == cont).all())
            out.append((float(lp.gather(1, cont[:, None]).sum()), greedy))
        return out

    # -- teacher-forced distributions ------------------------------------------------------------

    def token_logprobs(self, requests: list[TokenLogprobsRequest]) -> list[TokenLogprobs | Failure]:
        """Top-k next-token log-probs and the actual next token's log-prob at every position."""
        out: list[TokenLogprobs | Failure | None] = [None] * len(requests)
        members: list[tuple[int, list[int]]] = []
        for i, req in enumerate(requests):
            ids = self.tok_encode(req.text)[: min(req.max_tokens, self.max_length)]
            if len(ids) < 2 or req.top_k < 1:
                out[i] = Failure("text must tokenise to at least 2 tokens and top_k must be >= 1")
                continue
            members.append((i, ids))
        members.sort(key=lambda m: (-len(m[1]), m[0]))
        lengths = [len(ids) for _, ids in members]
        by_tokens = self._batch_sizes(lengths)
        vocab = int(self.model.config.vocab_size)

        def size(seq: Sequence[Any], start: int) -> int:  # every position's logits are kept: cap their bytes
            return min(by_tokens(seq, start), max(1, LOGITS_BUDGET_BYTES // (lengths[start] * vocab * 4)))

        batches = _chunks(members, size)

        def run(batch: list[tuple[int, list[int]]]) -> list[TokenLogprobs]:
            return self._token_logprobs_batch([ids for _, ids in batch], [requests[i].top_k for i, _ in batch])

        for batch, results in zip(batches, self._guarded(batches, run), strict=True):
            for (i, _), res in zip(batch, results, strict=True):
                out[i] = res
        assert all(r is not None for r in out)
        return out  # type: ignore[return-value]

    @torch.inference_mode()
    def _token_logprobs_batch(self, rows: list[list[int]], top_ks: list[int]) -> list[TokenLogprobs]:
        s = max(len(x) for x in rows)
        ids = torch.full((len(rows), s), self.pad_id, dtype=torch.long)
        for r, x in enumerate(rows):
            ids[r, : len(x)] = torch.tensor(x, dtype=torch.long)
        real = (torch.arange(s)[None, :] < torch.tensor([len(x) for x in rows])[:, None]).long()  # [n, s]
        spans = [(r, 0, len(x) - 1) for r, x in enumerate(rows)]
        logits = self._span_logits(ids.to(self.device), spans, cache=self.new_cache(real))
        out: list[TokenLogprobs] = []
        for r, (x, k) in enumerate(zip(rows, top_ks, strict=True)):
            lp = torch.log_softmax(logits[r].float(), dim=-1)  # [len-1, vocab]; t predicts x[t+1]
            target = torch.tensor(x[1:], dtype=torch.long, device=lp.device)
            top_v, top_i = lp.topk(min(k, lp.shape[-1]), dim=-1)  # descending
            out.append(TokenLogprobs(
                target_ids=x[1:],
                target_logprobs=_shortest_floats(lp.gather(1, target[:, None])[:, 0]),
                topk_ids=top_i.tolist(),
                topk_logprobs=[_shortest_floats(v) for v in top_v],
            ))
        return out

    def close(self) -> None:
        """Drop the model, the cached prefixes and (on GPU) the allocator's cache."""
        self._prefixes.clear()
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


# config attributes that rescale logits after the output layer (Cohere, Granite, ...): no split
LOGIT_SCALING_ATTRS = ("logit_scale", "logits_scaling", "output_multiplier_scale", "final_logit_scale")


@contextmanager
def _gqa_sdpa():
    """Let transformers' SDPA attention hand grouped K/V heads to torch as they are (enable_gqa) for
    multi-token steps with a padding mask, instead of copying each K/V head once per query head."""
    saved = os.environ.get(GQA_ENV)
    os.environ[GQA_ENV] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(GQA_ENV, None)
        else:
            os.environ[GQA_ENV] = saved


def _split_head(model: Any) -> tuple[Any, Any]:
    """(decoder, output layer) when logits are exactly output_layer(decoder last hidden state), up to
    Gemma's final soft cap; (None, None) for any other model (then full forwards are used)."""
    config = model.config
    if any(getattr(config, a, None) not in (None, 1, 1.0) for a in LOGIT_SCALING_ATTRS):
        return None, None
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None, None
    if decoder is None or decoder is model or not isinstance(head, torch.nn.Linear):
        return None, None
    return decoder, head


def _context_window(config: Any, tokenizer: Any) -> int:
    """The model's context window as lm-eval resolves it (config attributes, then tokenizer)."""
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    tml = getattr(tokenizer, "model_max_length", None)
    if isinstance(tml, int) and 0 < tml < 10**10:
        return tml
    return DEFAULT_MAX_LENGTH


def _kv_spec(kv: Mapping[str, Any] | None, scales: Path | None) -> tuple[Any, Any]:
    """Validate the arm's KV spec (and load its static scales) through the quant package."""
    if kv is None:
        if scales is not None:
            raise EngineError("hf engine: 'scales' given without a 'kv' spec; add kv = {...} or drop scales")
        return None, None
    from quant.errors import QuantError
    from quant.kv_spec import kv_spec_from_dict
    from quant.scales import KVScales

    try:
        spec = kv_spec_from_dict(dict(kv))
        loaded = KVScales.load(scales) if scales is not None else None
    except QuantError as exc:
        raise EngineError(f"hf engine: {exc}") from None
    if loaded is not None and spec.scales != "static":
        raise EngineError(f"hf engine: a scales file was given but kv.scales is {spec.scales!r}; set kv.scales = 'static'")
    return spec, loaded


def check_args(args: Mapping[str, Any], *, load_scales: bool = True) -> None:
    """Validate engine arguments and the KV spec (and read the scales file) without loading a model."""
    parsed = parse_args(args)
    _kv_spec(parsed.kv, parsed.scales if load_scales else None)


def build(model: ResolvedModel, args: Mapping[str, Any]) -> HFEngine:
    """Load `model` with transformers and wrap it as the `hf` engine."""
    parsed = parse_args(args)
    spec, scales = _kv_spec(parsed.kv, parsed.scales)
    if parsed.device.startswith("cuda") and not torch.cuda.is_available():
        raise EngineError(f"hf engine: device {parsed.device!r} requested but CUDA is not available; use device = 'cpu'")
    hf_model, tokenizer = load_model(model, dtype=parsed.dtype, device=parsed.device,
                                     trust_remote_code=parsed.trust_remote_code)
    engine = HFEngine(hf_model, tokenizer, parsed, model.name, kv_spec=spec, scales=scales)
    if spec is not None:
        from quant.errors import QuantError

        try:  # fail at build time, not on the first sample, when the spec does not fit the model
            engine.new_cache()
        except QuantError as exc:
            raise EngineError(f"hf engine: {exc}") from None
    return engine
