"""Teacher-forced next-token distributions: at every position of a text, the top-k log-probs and the
actual next token's log-prob (for KL-divergence and perplexity checks between arms). A request with a
`context` scores its text as a continuation of that context: the pair is tokenised as lm-eval's
log-likelihood splits it (`evals.engines.lmeval_tokens.encode_pair`) and only the positions predicting
the continuation's tokens are returned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from evals.engines.base import Failure, TokenLogprobs, TokenLogprobsRequest
from evals.engines.hf.model import HFModel
from evals.engines.hf.request_batches import LOGITS_BUDGET_BYTES, chunks, guarded, right_padded, token_budget
from evals.engines.lmeval_tokens import encode_pair

Row = tuple[int, list[int], int]  # (request index, input ids, index of the logit predicting the first scored token)


def shortest_floats(values: torch.Tensor) -> list[float]:
    """float32 values as the shortest decimals that round-trip float32 (small, exact records)."""
    arr = values.detach().to("cpu", torch.float32).numpy()
    return [float(s) for s in arr.astype(str).ravel()]


def scored_row(hf: HFModel, req: TokenLogprobsRequest) -> tuple[list[int], int] | Failure:
    """(input ids, start) of one request: the whole text from its first token (start 0), or, with a
    context, context + continuation (the context cut from the left to fit) with start at the logit that
    predicts the continuation's first token; the continuation is capped at `max_tokens`."""
    if req.top_k < 1:
        return Failure("top_k must be >= 1")
    if not req.context:
        ids = hf.tokens.encode(req.text)[: min(req.max_tokens, hf.max_length)]
        if len(ids) < 2:
            return Failure("text must tokenise to at least 2 tokens")
        return ids, 0
    ctx, cont = encode_pair(hf.tokens, req.context, req.text)
    cont = cont[: req.max_tokens]
    if not cont:
        return Failure("the continuation is empty after tokenisation")
    if len(cont) >= hf.max_length:
        return Failure(f"the continuation has {len(cont)} tokens; max_length is {hf.max_length}")
    whole = (ctx + cont)[-hf.max_length:]
    return whole, len(whole) - len(cont) - 1


def token_logprobs(hf: HFModel, requests: list[TokenLogprobsRequest]) -> list[TokenLogprobs | Failure]:
    """Top-k next-token log-probs and the actual next token's log-prob at every scored position."""
    out: list[TokenLogprobs | Failure | None] = [None] * len(requests)
    members: list[Row] = []
    for i, req in enumerate(requests):
        try:
            row = scored_row(hf, req)
        except Exception as exc:  # noqa: BLE001 - a tokeniser error fails this request only
            row = Failure(f"{type(exc).__name__}: {exc}")
        if isinstance(row, Failure):
            out[i] = row
            continue
        members.append((i, *row))
    members.sort(key=lambda m: (-len(m[1]), m[0]))
    lengths = [len(ids) for _, ids, _ in members]
    by_tokens = token_budget(hf.args, lengths)

    def size(seq: Sequence[Any], start: int) -> int:  # scored logits are kept: cap them at the longest row's
        return min(by_tokens(seq, start), max(1, LOGITS_BUDGET_BYTES // (lengths[start] * hf.vocab_size * 4)))

    batches = chunks(members, size)

    def run(batch: list[Row]) -> list[TokenLogprobs]:
        return logprobs_batch(hf, [ids for _, ids, _ in batch], [requests[i].top_k for i, _, _ in batch],
                              [start for _, _, start in batch])

    for batch, results in zip(batches, guarded(batches, run), strict=True):
        for (i, _, _), res in zip(batch, results, strict=True):
            out[i] = res
    assert all(r is not None for r in out)
    return out  # type: ignore[return-value]


@torch.inference_mode()
def logprobs_batch(hf: HFModel, rows: list[list[int]], top_ks: list[int],
                   starts: Sequence[int] | None = None) -> list[TokenLogprobs]:
    """One right-padded batch of token-id rows, each with its own top-k; row r is scored from the logit
    at `starts[r]` (default 0: every position) to its second-to-last token."""
    starts = starts if starts is not None else [0] * len(rows)
    ids, real = right_padded(rows, hf.tokens.pad_id)  # [n, s]
    spans = [(r, a, len(x) - 1 - a) for r, (x, a) in enumerate(zip(rows, starts, strict=True))]
    logits = hf.span_logits(ids.to(hf.device), spans, cache=hf.new_cache(real))
    out: list[TokenLogprobs] = []
    for r, (x, k, a) in enumerate(zip(rows, top_ks, starts, strict=True)):
        lp = torch.log_softmax(logits[r].float(), dim=-1)  # [len - 1 - a, vocab]; t predicts x[a + t + 1]
        target = torch.tensor(x[a + 1:], dtype=torch.long, device=lp.device)
        top_v, top_i = lp.topk(min(k, lp.shape[-1]), dim=-1)  # descending
        out.append(TokenLogprobs(
            target_ids=x[a + 1:],
            target_logprobs=shortest_floats(lp.gather(1, target[:, None])[:, 0]),
            topk_ids=top_i.tolist(),
            topk_logprobs=[shortest_floats(v) for v in top_v],
        ))
    return out
