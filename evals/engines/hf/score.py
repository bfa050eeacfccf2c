"""Log-likelihood scoring: the sum of a continuation's token log-probs given its context, and
whether the continuation is the greedy one, per (context, continuation) pair as lm-eval's HFLM
scores it (pairs split by `evals.engines.lmeval_tokens.encode_pair`).

With prefix reuse, pairs after a cached few-shot prefix read it from the cache, and a request with
several continuations that share one tokenised context (any non-empty context, as lm-eval splits
pairs) has that context prefilled once and its continuations read it from the cache (for a
quantized cache: stored, with dynamic scales from the context, as a serving engine with prefix
caching holds it). Otherwise each (context, continuation) pair is one right-padded row, as in lm-eval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from evals.engines.base import Failure, LoglikelihoodRequest, LoglikelihoodResult
from evals.engines.hf.model import HFModel
from evals.engines.hf.request_batches import (
    LOGITS_BUDGET_BYTES,
    Sizer,
    chunks,
    guarded,
    right_padded,
    token_budget,
)
from evals.engines.hf.shared_prefix import PrefixKV, PrefixStore
from evals.engines.lmeval_tokens import encode_pair

Score = tuple[float, bool]  # (log-likelihood, greedy)


@dataclass(frozen=True)
class Piece:
    """One (context, continuation) pair of a LoglikelihoodRequest, tokenised."""

    req: int
    choice: int
    ctx: list[int]
    cont: list[int]


def loglikelihood(hf: HFModel, prefixes: PrefixStore,
                  requests: list[LoglikelihoodRequest]) -> list[LoglikelihoodResult | Failure]:
    """Sum of continuation token log-probs (natural log) per continuation, and greedy flags."""
    failures: dict[int, Failure] = {}
    groups: dict[tuple[int, ...], list[Piece]] = {}  # per-pair rows, by cached prefix
    shared: dict[tuple[int, ...], list[list[Piece]]] = {}  # whole requests, by cached prefix
    cached: dict[tuple[int, ...], PrefixKV | None] = {(): None}
    for r, req in enumerate(requests):
        try:
            pre = prefixes.get(req.prefix)
            pieces = [Piece(r, c, *encode_pair(hf.tokens, context, cont))
                      for c, (context, cont) in enumerate(req.pairs())]
        except Exception as exc:  # noqa: BLE001
            failures[r] = Failure(f"{type(exc).__name__}: {exc}")
            continue
        if not req.continuations or any(not pc.cont for pc in pieces):
            failures[r] = Failure("every continuation must be non-empty after tokenisation")
            continue
        ctx = pieces[0].ctx
        fits = all(len(pc.ctx) + len(pc.cont) <= hf.max_length + 1 for pc in pieces)  # no left truncation
        key: tuple[int, ...] = ()
        if pre is not None and fits and all(len(pc.ctx) > len(pre.ids) and tuple(pc.ctx[: len(pre.ids)]) == pre.ids
                                            for pc in pieces):
            key = pre.ids
            cached[key] = pre
        if (hf.args.prefix_reuse and len(pieces) > 1 and req.context and fits and len(ctx) - 1 > len(key)
                and all(pc.ctx == ctx for pc in pieces)):
            shared.setdefault(key, []).append(pieces)
        else:
            groups.setdefault(key, []).extend(pieces)
    scored: dict[tuple[int, int], Score | Failure] = {}
    for key, pieces in groups.items():
        pre, cut = cached[key], len(key)
        pieces.sort(key=lambda pc: (-(len(pc.ctx) + len(pc.cont)), tuple(pc.ctx + pc.cont)))
        lengths = [min(len(pc.ctx) + len(pc.cont) - 1, hf.max_length) - cut for pc in pieces]
        batches = chunks(pieces, token_budget(hf.args, lengths))

        def run(batch: list[Piece], pre: PrefixKV | None = pre, cut: int = cut) -> list[Score]:
            return score_pairs(hf, batch, pre, cut)

        for batch, results in zip(batches, guarded(batches, run), strict=True):
            for pc, res in zip(batch, results, strict=True):
                scored[(pc.req, pc.choice)] = res
    for key, reqs in shared.items():
        pre, cut = cached[key], len(key)
        reqs.sort(key=lambda ps: (-len(ps[0].ctx), ps[0].req))
        req_batches = chunks(reqs, shared_sizes(hf, reqs, cut))

        def run_shared(batch: list[list[Piece]], pre: PrefixKV | None = pre, cut: int = cut) -> list[list[Score]]:
            return score_shared(hf, batch, pre, cut)

        for batch, results in zip(req_batches, guarded(req_batches, run_shared), strict=True):
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


def shared_sizes(hf: HFModel, reqs: list[list[Piece]], cut: int) -> Sizer:
    """Batch sizer for shared-context requests (sorted by descending context length): at most
    batch_size contexts, max_batch_tokens context tokens, and continuation logits within budget."""
    args = hf.args

    def size(_seq: Sequence[Any], start: int) -> int:
        longest_ctx = max(1, len(reqs[start][0].ctx) - cut)
        n = rows = longest_cont = 0
        for ps in reqs[start : start + args.batch_size]:
            rows += len(ps)
            longest_cont = max(longest_cont, *(len(pc.cont) for pc in ps))
            if n and ((n + 1) * longest_ctx > args.max_batch_tokens
                      or rows * longest_cont * hf.vocab_size * 4 > LOGITS_BUDGET_BYTES):
                break
            n += 1
        return n

    return size


def _score(logits: torch.Tensor, cont: list[int]) -> Score:
    """(sum of log-probs of `cont`, whether `cont` is the argmax at every step) from logits [len(cont), vocab]."""
    lp = torch.log_softmax(logits.float(), dim=-1)  # [cont, vocab]
    target = torch.tensor(cont, dtype=torch.long, device=lp.device)
    return float(lp.gather(1, target[:, None]).sum()), bool((lp.argmax(dim=-1) == target).all())


@torch.inference_mode()
def score_shared(hf: HFModel, batch: list[list[Piece]], pre: PrefixKV | None, cut: int) -> list[list[Score]]:
    """Prefill each request's context (minus its last token) once, then score every continuation
    as [last context token] + continuation[:-1] on a copy of that request's cache rows."""
    n = len(batch)
    # non-empty: the caller checked len(ctx) - 1 > cut
    ids1, real1 = right_padded([ps[0].ctx[cut:-1] for ps in batch], hf.tokens.pad_id)  # [n, s1]
    s1 = ids1.shape[1]
    mask1 = torch.cat([torch.ones((n, cut), dtype=torch.long), real1], dim=1)  # [n, cut + s1]
    pos1 = (cut + torch.arange(s1)).expand(n, s1)
    cache = pre.expand(n) if pre is not None else hf.new_cache(real1)
    dev = hf.device
    hf.forward(ids1.to(dev), cache=cache, attention_mask=mask1.to(dev), position_ids=pos1.to(dev), logits_to_keep=1)
    rows = [(i, pc) for i, ps in enumerate(batch) for pc in ps]
    index = torch.tensor([i for i, _ in rows], dtype=torch.long)
    cache.batch_select_indices(index.to(dev))  # one cache row per continuation
    ids2, real2 = right_padded([[pc.ctx[-1], *pc.cont[:-1]] for _, pc in rows], hf.tokens.pad_id)  # [rows, s2]
    s2 = ids2.shape[1]
    # the pads after a short context stay masked; each continuation's positions follow its context
    mask2 = torch.cat([mask1[index], real2], dim=1)  # [rows, cut + s1 + s2]
    pos2 = torch.tensor([len(pc.ctx) - 1 for _, pc in rows])[:, None] + torch.arange(s2)[None, :]
    spans = [(j, 0, len(pc.cont)) for j, (_, pc) in enumerate(rows)]
    logits = hf.span_logits(ids2.to(dev), spans, cache=cache, attention_mask=mask2.to(dev), position_ids=pos2.to(dev))
    out: list[list[Score]] = [[] for _ in batch]
    for j, (i, pc) in enumerate(rows):
        out[i].append(_score(logits[j], pc.cont))
    return out


@torch.inference_mode()
def score_pairs(hf: HFModel, batch: list[Piece], pre: PrefixKV | None, cut: int) -> list[Score]:
    """Score one right-padded batch of pairs after the first `cut` (cached) tokens; logits only from
    the first continuation position on."""
    inputs: list[list[int]] = []
    starts: list[int] = []  # index (in the row's input) of the logit predicting cont[0]
    for pc in batch:
        whole = (pc.ctx + pc.cont)[-(hf.max_length + 1):][:-1][cut:]
        inputs.append(whole)
        starts.append(len(whole) - len(pc.cont))
    ids, real = right_padded(inputs, hf.tokens.pad_id)  # [n, s]
    cache = pre.expand(len(batch)) if pre is not None else hf.new_cache(real)
    # right padding: pads come after every real token, so causal attention never sees them
    spans = [(row, starts[row], len(pc.cont)) for row, pc in enumerate(batch)]
    logits = hf.span_logits(ids.to(hf.device), spans, cache=cache)
    return [_score(logits[row], pc.cont) for row, pc in enumerate(batch)]
