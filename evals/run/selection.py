"""Seeded choices that must agree between arms: which items a `limit` keeps, and each sample's seed.

Both are pure functions of (seed, item id[, repeat]) through sha256, so the baseline and the
candidate select the same items and draw with the same per-sample seeds, whatever order the items
arrive in, whatever else runs in the process, and on any machine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TypeVar

from evals.errors import EvalError
from evals.tasks.base import Item

T = TypeVar("T", bound=Item)
SEED_BITS = 63  # per-sample seeds fit a signed int64 (torch.Generator.manual_seed, numpy)


def _hash_int(*parts: object) -> int:
    """A 63-bit integer from sha256 of the parts joined by NUL (parts are str()-ed)."""
    digest = hashlib.sha256("\0".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)


def select_items(items: Sequence[T], limit: int | None, seed: int) -> list[T]:
    """A seeded random subset of `limit` items, in the dataset's order (all items when limit is None
    or not smaller). Ranking is by sha256(seed, item id), so the subset does not depend on the
    order of `items`, and a larger limit keeps every item a smaller one chose."""
    if limit is None or limit >= len(items):
        return list(items)
    if limit < 1:
        raise EvalError(f"limit must be a positive number of items, got {limit}")
    ids = [it.item_id for it in items]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise EvalError(f"item id {dup!r} occurs more than once; a task's item ids must be unique")
    chosen = set(sorted(range(len(items)), key=lambda i: (_hash_int("select", seed, ids[i]), ids[i]))[:limit])
    return [it for i, it in enumerate(items) if i in chosen]


def sample_seed(seed: int, task: str, item_id: str, repeat: int) -> int:
    """The sampling seed of one (task, item, repeat): the same in every arm, distinct per repeat."""
    return _hash_int("sample", seed, task, item_id, repeat)
