"""The fixed-batch generation path: left-padded prompts after an optional cached prefix, decoded
together one token per step; finished rows leave the batch. Used for models with sliding-window
layers (their caches have no row operations) and as the one-request-at-a-time fallback."""

from __future__ import annotations

import torch

from evals.engines.base import GenerateRequest, GenerateResult
from evals.engines.hf.model import HFModel
from evals.engines.hf.sequence import pick, sampler, step_result, stop_window
from evals.engines.hf.shared_prefix import PrefixKV


@torch.inference_mode()
def generate_batch(hf: HFModel, reqs: list[GenerateRequest], prompts: list[list[int]],
                   pre: PrefixKV | None) -> list[GenerateResult]:
    """Generate for one fixed batch: `prompts[i]` (token ids after the prefix) for `reqs[i]`."""
    n, p = len(prompts), (len(pre.ids) if pre is not None else 0)
    s = max(len(x) for x in prompts)
    dev = hf.device
    input_ids = torch.full((n, s), hf.tokens.pad_id, dtype=torch.long)
    mask = torch.zeros((n, p + s), dtype=torch.long)
    mask[:, :p] = 1
    for row, ids in enumerate(prompts):
        input_ids[row, s - len(ids):] = torch.tensor(ids, dtype=torch.long)
        mask[row, p + s - len(ids):] = 1
    # positions continue after the prefix and skip the pads between prefix and prompt
    pos = mask[:, p:].cumsum(-1) - 1 + p  # [n, s]
    pos.masked_fill_(mask[:, p:] == 0, 1)
    input_ids, mask, pos = input_ids.to(dev), mask.to(dev), pos.to(dev)
    step = hf.args.prefill_chunk
    cache = pre.expand(n) if pre is not None else hf.new_cache(mask[:, : min(s, step)])
    for start in range(0, s, step):
        end = min(s, start + step)
        logits = hf.forward(input_ids[:, start:end], cache=cache, attention_mask=mask[:, : p + end],
                            position_ids=pos[:, start:end], logits_to_keep=1)
    last = logits[:, -1, :].float()  # [n, vocab]
    next_pos = pos[:, -1] + 1  # [n]

    gens = [sampler(req, dev) for req in reqs]
    windows = [stop_window(req) for req in reqs]
    tokens: list[list[int]] = [[] for _ in reqs]
    results: list[GenerateResult | None] = [None] * n
    rows = list(range(n))  # request index of each live batch row
    while rows:
        picked = pick(last, [reqs[i] for i in rows], [gens[i] for i in rows])
        keep: list[int] = []
        for b, i in enumerate(rows):
            tokens[i].append(picked[b])
            results[i] = step_result(hf.tokens, reqs[i], tokens[i], windows[i])
            if results[i] is None:
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
        last = hf.forward(picked_t[:, None], cache=cache, attention_mask=mask,
                          position_ids=next_pos[:, None], logits_to_keep=1)[:, -1, :].float()
        next_pos = next_pos + 1
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]
