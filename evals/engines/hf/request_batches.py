"""How requests become forward batches: consecutive chunks under a size rule, the token-budget rule,
right-padded id tensors, and running batches so that one failing request fails alone."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from evals.engines.base import Failure
from evals.engines.hf.args import HFEngineArgs

log = logging.getLogger(__name__)

LOGITS_BUDGET_BYTES = 1 << 30  # logits held at once by one scoring batch (rows x positions x vocab x 4 B)

R = TypeVar("R")
T = TypeVar("T")
Sizer = Callable[[Sequence[Any], int], int]  # (items, start) -> how many to take at start


def chunks(seq: Sequence[T], sizes: Sizer) -> list[list[T]]:
    """Split `seq` into consecutive batches; `sizes(seq, start)` says how many to take at `start`."""
    out: list[list[T]] = []
    start = 0
    while start < len(seq):
        n = max(1, sizes(seq, start))
        out.append(list(seq[start : start + n]))
        start += n
    return out


def token_budget(args: HFEngineArgs, lengths: Sequence[int]) -> Sizer:
    """Batch sizer for items sorted by descending length: batch_size, capped by the token budget."""

    def size(_seq: Sequence[Any], start: int) -> int:
        longest = max(1, lengths[start])
        return min(args.batch_size, max(1, args.max_batch_tokens // longest))

    return size


def right_padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [n, longest] right-padded with pad_id, real-token mask [n, longest] with 1 = real)."""
    s = max(len(x) for x in rows)
    ids = torch.full((len(rows), s), pad_id, dtype=torch.long)
    for i, x in enumerate(rows):
        ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
    real = (torch.arange(s)[None, :] < torch.tensor([len(x) for x in rows])[:, None]).long()
    return ids, real


def guarded(batches: list[list[T]], run: Callable[[list[T]], list[R]]) -> list[list[R | Failure]]:
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
            results.append([r for item in batch for r in guarded([[item]], run)[0]])
    return results
