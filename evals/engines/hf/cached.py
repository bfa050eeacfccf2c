"""Requests served through the hf engine's prefix cache (`evals.engines.hf.prefix_cache`): generation
and teacher-forced log-probs, in request order (a later request may hit an earlier one's prompt, as in a
serving engine), each prompt prefilled alone with block-aligned chunks, with its prompt and cached token
counts in the result (GenerateResult.prompt_tokens / cached_tokens).

Generation decodes in the continuous-batching decoder (`evals.engines.hf.decode`), whose prefill is
this prefix cache's; a model with sliding-window layers (whose caches have no row operations) decodes
each request alone after its prefill (`decode_alone`), in the warm and the cold path alike. Log-likelihood requests are not served from it (they keep the few-shot prefix of
`evals.engines.hf.shared_prefix`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from evals.engines.base import Failure, GenerateRequest, GenerateResult, TokenLogprobs, TokenLogprobsRequest
from evals.engines.hf.decode import Member, generate_stream
from evals.engines.hf.logprobs import scored_row, shortest_floats
from evals.engines.hf.model import HFModel
from evals.engines.hf.prefix_cache import PrefixCache
from evals.engines.hf.sequence import pick, sampler, step_result, stop_window


def cached_generate(hf: HFModel, cache: PrefixCache,
                    requests: list[GenerateRequest]) -> list[GenerateResult | Failure]:
    """Greedy or seeded-sampled generation with every prompt prefilled through the prefix cache."""
    out: list[GenerateResult | Failure | None] = [None] * len(requests)
    members: list[Member] = []
    for i, req in enumerate(requests):
        if req.max_tokens < 1 or req.max_tokens >= hf.max_length:
            out[i] = Failure(f"max_tokens {req.max_tokens} must be in [1, {hf.max_length - 1}]")
            continue
        try:
            members.append((i, hf.tokens.encode(req.prompt)[-(hf.max_length - req.max_tokens):]))
        except Exception as exc:  # noqa: BLE001 - a tokeniser error fails this request only
            out[i] = Failure(f"{type(exc).__name__}: {exc}")
    hits: dict[int, int] = {}

    def prefill(i: int, ids: list[int]) -> tuple[Any, torch.Tensor]:
        served = cache.serve(ids, len(ids) - 1, len(ids))
        hits[i] = served.cached
        return served.cache, served.logits  # logits [1, vocab]: the last position's

    if members and not hf.rows_ok:
        for i, ids in members:
            try:
                served = cache.serve(ids, len(ids) - 1, len(ids))
                hits[i] = served.cached
                out[i] = decode_alone(hf, requests[i], served.cache, served.logits, len(ids))
            except Exception as exc:  # noqa: BLE001 - one bad request must not sink the others
                out[i] = Failure(f"{type(exc).__name__}: {exc}")
    elif members:  # in request order: which prompt is served first decides what the next one hits
        for i, res in generate_stream(hf, requests, members, None, prefill=prefill).items():
            out[i] = res
    for i, ids in members:
        res = out[i]
        if isinstance(res, GenerateResult):
            out[i] = replace(res, prompt_tokens=len(ids), cached_tokens=hits.get(i, 0))
    assert all(r is not None for r in out)
    return out  # type: ignore[return-value]


@torch.inference_mode()
def decode_alone(hf: HFModel, req: GenerateRequest, kv: Any, last: torch.Tensor, length: int) -> GenerateResult:
    """Decode one sequence from its prefilled cache `kv` (`length` positions) and the last position's
    logits [1, vocab], one token per step, with the picks and stops of the batched decoders."""
    gen = sampler(req, hf.device)
    window = stop_window(req)
    tokens: list[int] = []
    while True:
        tokens.append(pick(last.float(), [req], [gen])[0])
        done = step_result(hf.tokens, req, tokens, window)
        if done is not None:
            return done
        x = torch.tensor([[tokens[-1]]], dtype=torch.long, device=hf.device)
        pos = torch.tensor([[length]], dtype=torch.long, device=hf.device)
        last = hf.forward(x, cache=kv, position_ids=pos, logits_to_keep=1)[:, -1, :]
        length += 1


def cached_token_logprobs(hf: HFModel, cache: PrefixCache,
                          requests: list[TokenLogprobsRequest]) -> list[TokenLogprobs | Failure]:
    """Top-k next-token log-probs at every scored position (after `context` when a request has one),
    each request's sequence prefilled through the prefix cache in request order."""
    out: list[TokenLogprobs | Failure] = []
    for req in requests:
        try:
            row = scored_row(hf, req)
            if isinstance(row, Failure):
                out.append(row)
                continue
            ids, start = row
            served = cache.serve(ids, start, len(ids) - 1)
        except Exception as exc:  # noqa: BLE001 - one bad request must not sink the others
            out.append(Failure(f"{type(exc).__name__}: {exc}"))
            continue
        lp = torch.log_softmax(served.logits.float(), dim=-1)  # [len - 1 - start, vocab]; t predicts ids[start+t+1]
        target = ids[start + 1:]
        top_v, top_i = lp.topk(min(req.top_k, lp.shape[-1]), dim=-1)  # descending
        picked = lp.gather(1, torch.tensor(target, dtype=torch.long, device=lp.device)[:, None])[:, 0]
        out.append(TokenLogprobs(target_ids=target, target_logprobs=shortest_floats(picked),
                                 topk_ids=top_i.tolist(), topk_logprobs=[shortest_floats(v) for v in top_v]))
    return out
