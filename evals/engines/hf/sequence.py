"""One generated sequence, token by token: its seeded sampler, the next-token pick (vLLM's sampling
filters: temperature, min_p, top_k, top_p), the stop checks and its result (decoded and cut at the
first stop string as lm-eval's `until` does). Shared by the continuous-batching decoder and the
fixed-batch fallback, so both emit the same tokens."""

from __future__ import annotations

from typing import Literal

import torch

from evals.engines.base import GenerateRequest, GenerateResult
from evals.engines.hf.tokens import HFTokens
from evals.engines.stops import cut_at_stop

STOP_WINDOW_EXTRA = 4  # tokens decoded beyond the longest stop string's length when checking for it


def sampler(req: GenerateRequest, device: torch.device) -> torch.Generator | None:
    """The request's own generator (seeded with its seed, else 0) when it samples; None when greedy."""
    if req.temperature <= 0:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(req.seed if req.seed is not None else 0)
    return gen


def stop_window(req: GenerateRequest) -> int:
    """How many trailing tokens to decode when checking whether a stop string has appeared."""
    return max((len(u) for u in req.until), default=0) + STOP_WINDOW_EXTRA


def sampling_logits(row: torch.Tensor, req: GenerateRequest) -> torch.Tensor:
    """One row of logits [vocab] filtered for sampling, in vLLM's v1 sampler order
    (vllm/v1/sample/sampler.py `Sampler.sample`): divide by temperature; min_p (the argmax-invariant
    logits processor, builtin.py `MinPLogitsProcessor`: drop tokens whose probability is below
    min_p x the top probability); then top-k and top-p together (ops/topk_topp_sampler.py
    `apply_top_k_top_p_pytorch`: keep logits >= the k-th largest, ties kept; then, over what is
    left, drop the low tail whose probability mass is <= 1 - top_p, never the top token).
    Dropped tokens get -inf. top_k 0 (or >= vocab), top_p 1 and min_p 0 are off."""
    row = row / req.temperature
    if req.min_p > 0:
        probs = row.softmax(-1)
        row = row.masked_fill(probs < probs.max() * req.min_p, float("-inf"))
    top_k = req.top_k if 0 < req.top_k < row.shape[-1] else 0
    if not top_k and req.top_p >= 1.0:
        return row
    sorted_logits, order = torch.sort(row, descending=False)  # ascending, as vLLM
    if top_k:
        kth = sorted_logits[row.shape[-1] - top_k]
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if req.top_p < 1.0:
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum <= (1 - req.top_p)
        drop[-1] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return row.scatter(0, order, sorted_logits)


def pick(logits: torch.Tensor, reqs: list[GenerateRequest], gens: list[torch.Generator | None]) -> list[int]:
    """Next token per row of logits [rows, vocab]: argmax (first index on ties) or a draw from the
    row's generator after `sampling_logits` (temperature, min_p, top_k, top_p)."""
    picked = logits.argmax(dim=-1).tolist()
    for b, (req, g) in enumerate(zip(reqs, gens, strict=True)):
        if g is None:
            continue
        probs = sampling_logits(logits[b], req).softmax(-1)  # [vocab]
        picked[b] = int(torch.multinomial(probs, 1, generator=g).item())
    return picked


def has_stop(tok: HFTokens, tokens: list[int], until: tuple[str, ...], window: int) -> bool:
    """Whether the text of the last `window` tokens contains a stop string."""
    tail = tok.decode(tokens[-window:])
    return cut_at_stop(tail, until) != tail


def finish(tok: HFTokens, req: GenerateRequest, tokens: list[int], count: int,
           reason: Literal["stop", "length"]) -> GenerateResult:
    """The result of a finished sequence: `tokens` decoded and cut at the first stop string."""
    return GenerateResult(text=cut_at_stop(tok.decode(tokens), req.until), output_tokens=count,
                          finish_reason=reason)


def step_result(tok: HFTokens, req: GenerateRequest, tokens: list[int], window: int) -> GenerateResult | None:
    """After appending a token to `tokens`: the result when the sequence is finished (EOS, a stop
    string in the last `window` tokens' text, or max_tokens), else None."""
    if tokens[-1] in tok.eos_ids:
        return finish(tok, req, tokens[:-1], len(tokens), "stop")
    if req.until and has_stop(tok, tokens, req.until, window):
        return finish(tok, req, tokens, len(tokens), "stop")
    if len(tokens) >= req.max_tokens:
        return finish(tok, req, tokens, len(tokens), "length")
    return None
