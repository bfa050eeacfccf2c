"""One generated sequence, token by token: its seeded sampler, the next-token pick, the stop checks
and its result (decoded and cut at the first stop string as lm-eval's `until` does). Shared by the
continuous-batching decoder and the fixed-batch fallback, so both emit the same tokens."""

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


def pick(logits: torch.Tensor, reqs: list[GenerateRequest], gens: list[torch.Generator | None]) -> list[int]:
    """Next token per row of logits [rows, vocab]: argmax (first index on ties) or a draw from the row's generator."""
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
