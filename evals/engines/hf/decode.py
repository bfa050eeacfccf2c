"""Continuous batching for generation, with speculative greedy decoding from prompt-lookup drafts.

Each prompt is prefilled alone and unpadded (faster on CPU than a padded batch, and no causal work
on padding), then joins the decoding batch right-aligned: a shorter sequence is left-padded with
masked zeros, a finished sequence's row is overwritten by the next prompt, and positions that are
padding for every row are dropped. A greedy row may feed draft tokens (`evals.engines.hf.lookup`)
after its pending token in the same step and keep those that greedy decoding confirms: the output
is the one-token-per-step output, in fewer passes.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from evals.engines.base import Failure, GenerateRequest, GenerateResult
from evals.engines.hf.fixed_batch import generate_batch
from evals.engines.hf.lookup import PromptLookup
from evals.engines.hf.model import HFModel
from evals.engines.hf.request_batches import guarded
from evals.engines.hf.sequence import pick, sampler, step_result, stop_window
from evals.engines.hf.shared_prefix import PrefixKV
from evals.engines.hf.surgery import gqa_sdpa

log = logging.getLogger(__name__)

TRIM_MIN_POSITIONS = 64  # drop positions that are padding in every decoding row once there are this many
# tokens fed per speculative step (rows x (1 + drafts)): about where a step of this CPU turns from
# reading the weights to computing (a 16-row step with 4 drafts each took 1.6x a plain step)
DRAFT_TOKEN_BUDGET = 32

Member = tuple[int, list[int]]  # (request index, prompt token ids including the cached prefix)
# (request index, prompt ids) -> (its prefilled cache, the last position's logits [1, vocab]): a prefill
# other than the chunked one below (the prefix cache's, evals.engines.hf.cached)
Prefill = Callable[[int, list[int]], tuple[Any, torch.Tensor]]
Results = dict[int, GenerateResult | Failure]  # by request index


@dataclass
class Row:
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


def generate_stream(hf: HFModel, requests: list[GenerateRequest], members: list[Member],
                    pre: PrefixKV | None, prefill: Prefill | None = None) -> Results:
    """Generate for `members` (requests whose prompts start with `pre`, sorted longest first) with at
    most batch_size sequences decoding at once, within the token budget. On an error the unfinished
    requests are run again one by one, so only a failing request fails."""
    cut = len(pre.ids) if pre is not None else 0
    longest = max(len(ids) - cut + requests[i].max_tokens for i, ids in members)
    width = min(hf.args.batch_size, max(1, hf.args.max_batch_tokens // max(1, longest)))
    out: Results = {}
    try:
        ContinuousBatch(hf, requests, pre, out, prefill).run(deque(members), width)
    except Exception as exc:  # noqa: BLE001 - fall back to one request at a time
        rest = [m for m in members if m[0] not in out]
        log.warning("hf engine: batched decoding failed (%s); running %d requests one by one", exc, len(rest))
        for i, ids in rest:
            req, prompt = requests[i], ids[cut:]
            res = guarded([[i]], lambda _b, req=req, prompt=prompt: generate_batch(hf, [req], [prompt], pre))
            out[i] = res[0][0]
    return out


class ContinuousBatch:
    """One continuous-batching run: rows are admitted from a queue, decode together, and leave when
    finished; results go into `out` by request index."""

    def __init__(self, hf: HFModel, requests: list[GenerateRequest], pre: PrefixKV | None, out: Results,
                 prefill: Prefill | None = None) -> None:
        self.hf = hf
        self.prefill = prefill
        self.requests = requests
        self.pre = pre
        self.cut = len(pre.ids) if pre is not None else 0
        self.out = out

    @torch.inference_mode()
    def prefill_row(self, req: GenerateRequest, ids: list[int], gen: torch.Generator | None, index: int = -1) -> Row:
        """Prefill one prompt (the ids after the cached prefix) unpadded, and pick its first token."""
        hf, pre = self.hf, self.pre
        p = self.cut
        if self.prefill is not None:
            cache, last = self.prefill(index, ids)
        else:
            cache = pre.expand(1) if pre is not None else hf.new_cache()
            x = torch.tensor([ids], dtype=torch.long, device=hf.device)
            step = hf.args.prefill_chunk
            for start in range(0, len(ids), step):
                end = min(len(ids), start + step)
                pos = torch.arange(p + start, p + end, device=hf.device)[None, :]
                logits = hf.forward(x[:, start:end], cache=cache, position_ids=pos, logits_to_keep=1)
            last = logits[:, -1, :]
        first = pick(last.float(), [req], [gen])[0]
        return Row(cache=cache, length=p + len(ids), pending=first, next_pos=p + len(ids), gen=gen,
                   window=stop_window(req))

    def row_done(self, req: GenerateRequest, row: Row) -> GenerateResult | None:
        """Take the row's pending token; the result when the sequence is finished, else None."""
        row.tokens.append(row.pending)
        return step_result(self.hf.tokens, req, row.tokens, row.window)

    def admit(self, queue: deque[Member]) -> tuple[int, Row] | None:
        """The next queued request, prefilled; None when the queue is empty. Requests that finish
        (or fail) at their first token are recorded and skipped."""
        while queue:
            i, ids = queue.popleft()
            req = self.requests[i]
            gen = sampler(req, self.hf.device)
            try:
                row = self.prefill_row(req, ids[self.cut:], gen, i)
            except Exception as exc:  # noqa: BLE001 - one bad request must not sink the others
                self.out[i] = Failure(f"{type(exc).__name__}: {exc}")
                continue
            done = self.row_done(req, row)
            if done is not None:
                self.out[i] = done
                continue
            if self.hf.drafts_ok and gen is None:
                row.lookup = PromptLookup([*ids, *row.tokens])
            return i, row
        return None

    @torch.inference_mode()
    def run(self, queue: deque[Member], width: int) -> None:
        """The decoding loop: at most `width` rows at once, finished rows refilled from `queue`."""
        hf, requests, out = self.hf, self.requests, self.out
        dev = hf.device
        live: list[tuple[int, Row]] = []  # (request index, row), in cache row order
        first = [r for r in (self.admit(queue) for _ in range(width)) if r is not None]
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
            k = min(hf.args.draft_tokens, DRAFT_TOKEN_BUDGET // len(live) - 1)  # drafts per row this step
            drafts = [self.draft(requests[i], row, k) for i, row in live]
            if any(drafts):
                mask, free = self.speculative_step(live, drafts, cache, mask)
            else:
                tokens = torch.tensor([[row.pending] for _, row in live], dtype=torch.long, device=dev)
                pos = torch.tensor([[row.next_pos] for _, row in live], dtype=torch.long, device=dev)
                mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
                logits = hf.forward(tokens, cache=cache, attention_mask=mask, position_ids=pos,
                                    logits_to_keep=1)[:, -1, :].float()
                picked = pick(logits, [requests[i] for i, _ in live], [row.gen for _, row in live])
                free = []
                for b, (i, row) in enumerate(live):
                    row.pending, row.next_pos = picked[b], row.next_pos + 1
                    done = self.row_done(requests[i], row)
                    if done is not None:
                        out[i] = done
                        free.append(b)
                    elif row.lookup is not None:
                        row.lookup.extend([row.pending])
            while free and queue:  # refill finished rows
                nxt = self.admit(queue)
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
    def draft(req: GenerateRequest, row: Row, k: int) -> list[int]:
        """Up to k prompt-lookup draft tokens to follow the row's pending token ([] for sampled rows,
        and no more than the row can use before reaching max_tokens)."""
        if row.lookup is None:
            return []
        return row.lookup.draft(min(k, req.max_tokens - len(row.tokens) - 1))

    def speculative_step(self, live: list[tuple[int, Row]], drafts: list[list[int]], cache: Any,
                         mask: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """One decoding step that feeds each row's pending token and its draft tokens (rows padded
        to the longest draft) and keeps, per greedy row, the drafts that greedy decoding confirms
        plus the token greedy picks after them; a sampled row takes one token as in a plain step.
        Rejected and padding positions stay in the cache, masked out. Returns the extended mask and
        the batch rows whose sequence finished."""
        hf = self.hf
        dev = hf.device
        m = 1 + max(len(d) for d in drafts)
        fill = hf.tokens.pad_id
        tokens = torch.tensor([[row.pending, *d] + [fill] * (m - 1 - len(d)) for (_, row), d in zip(live, drafts)],
                              dtype=torch.long, device=dev)
        pos = torch.tensor([[row.next_pos + j for j in range(m)] for _, row in live], dtype=torch.long, device=dev)
        new = torch.tensor([[1] * (1 + len(d)) + [0] * (m - 1 - len(d)) for d in drafts], dtype=mask.dtype,
                           device=dev)
        mask = torch.cat([mask, new], dim=1)
        with gqa_sdpa():
            logits = hf.span_logits(tokens, [(b, 0, 1 + len(d)) for b, d in enumerate(drafts)], cache=cache,
                                    attention_mask=mask, position_ids=pos)  # per row [1 + len(d), vocab]
        free: list[int] = []
        for b, ((i, row), d) in enumerate(zip(live, drafts)):
            req = self.requests[i]
            if row.gen is not None:  # sampled: one token from the first position, with the row's generator
                emit = pick(logits[b][:1].float(), [req], [row.gen])
            else:
                greedy = logits[b].float().argmax(dim=-1).tolist()  # greedy[j]: the token after input j
                a = 0
                while a < len(d) and d[a] == greedy[a]:
                    a += 1
                emit = [*d[:a], greedy[a]]
            done = None
            for tok in emit:
                row.pending = tok
                done = self.row_done(req, row)
                if done is not None:
                    break
            if done is not None:
                self.out[i] = done
                free.append(b)
                continue
            row.next_pos += len(emit)
            mask[b, mask.shape[1] - m + len(emit):] = 0  # rejected drafts and padding
            if row.lookup is not None:
                row.lookup.extend(emit)
        return mask, free
