"""Teacher-forced next-token distributions: at every position of a text, the top-k log-probs and the
actual next token's log-prob (for KL-divergence and perplexity checks between arms)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from evals.engines.base import Failure, TokenLogprobsRequest
from evals.engines.hf.batching import LOGITS_BUDGET_BYTES, chunks, guarded, right_padded, token_budget
from evals.engines.hf.model import HFModel
from evals.records import TokenLogprobs


def shortest_floats(values: torch.Tensor) -> list[float]:
    """float32 values as the shortest decimals that round-trip float32 (small, exact records)."""
    arr = values.detach().to("cpu", torch.float32).numpy()
    return [float(s) for s in arr.astype(str).ravel()]


def token_logprobs(hf: HFModel, requests: list[TokenLogprobsRequest]) -> list[TokenLogprobs | Failure]:
    """Top-k next-token log-probs and the actual next token's log-prob at every position."""
    out: list[TokenLogprobs | Failure | None] = [None] * len(requests)
    members: list[tuple[int, list[int]]] = []
    for i, req in enumerate(requests):
        ids = hf.tokens.encode(req.text)[: min(req.max_tokens, hf.max_length)]
        if len(ids) < 2 or req.top_k < 1:
            out[i] = Failure("text must tokenise to at least 2 tokens and top_k must be >= 1")
            continue
        members.append((i, ids))
    members.sort(key=lambda m: (-len(m[1]), m[0]))
    lengths = [len(ids) for _, ids in members]
    by_tokens = token_budget(hf.args, lengths)

    def size(seq: Sequence[Any], start: int) -> int:  # every position's logits are kept: cap their bytes
        return min(by_tokens(seq, start), max(1, LOGITS_BUDGET_BYTES // (lengths[start] * hf.vocab_size * 4)))

    batches = chunks(members, size)

    def run(batch: list[tuple[int, list[int]]]) -> list[TokenLogprobs]:
        return logprobs_batch(hf, [ids for _, ids in batch], [requests[i].top_k for i, _ in batch])

    for batch, results in zip(batches, guarded(batches, run), strict=True):
        for (i, _), res in zip(batch, results, strict=True):
            out[i] = res
    assert all(r is not None for r in out)
    return out  # type: ignore[return-value]


@torch.inference_mode()
def logprobs_batch(hf: HFModel, rows: list[list[int]], top_ks: list[int]) -> list[TokenLogprobs]:
    """One right-padded batch of token-id rows, each with its own top-k."""
    ids, real = right_padded(rows, hf.tokens.pad_id)  # [n, s]
    spans = [(r, 0, len(x) - 1) for r, x in enumerate(rows)]
    logits = hf.span_logits(ids.to(hf.device), spans, cache=hf.new_cache(real))
    out: list[TokenLogprobs] = []
    for r, (x, k) in enumerate(zip(rows, top_ks, strict=True)):
        lp = torch.log_softmax(logits[r].float(), dim=-1)  # [len-1, vocab]; t predicts x[t+1]
        target = torch.tensor(x[1:], dtype=torch.long, device=lp.device)
        top_v, top_i = lp.topk(min(k, lp.shape[-1]), dim=-1)  # descending
        out.append(TokenLogprobs(
            target_ids=x[1:],
            target_logprobs=shortest_floats(lp.gather(1, target[:, None])[:, 0]),
            topk_ids=top_i.tolist(),
            topk_logprobs=[shortest_floats(v) for v in top_v],
        ))
    return out
