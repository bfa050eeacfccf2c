"""The shared few-shot prefix: its KV is computed once, held in the same cache class as every other
KV (so quantized exactly as the real cache would hold it), and copied into each sequence that starts
with it. With prefix reuse the suffix reads the prefix from the cache, as a serving engine with
prefix caching does."""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from evals.engines.hf.model import HFModel

MAX_PREFIXES = 4  # few-shot prefixes whose KV is kept; one per task is the common case
MAX_PREFIX_TEXTS = 64  # prefix strings whose token ids are remembered (per-item prefixes would grow it)


@dataclass
class PrefixKV:
    """The cached KV of a shared prompt prefix (token ids, batch 1)."""

    ids: tuple[int, ...]
    cache: Any  # transformers Cache holding len(ids) positions

    def expand(self, n: int) -> Any:
        """A private copy of the cache repeated to batch size n."""
        cache = copy.deepcopy(self.cache)
        if n > 1:
            cache.batch_repeat_interleave(n)
        return cache


class PrefixStore:
    """The most recently used prefixes' KV, computed on first use."""

    def __init__(self, hf: HFModel) -> None:
        self.hf = hf
        self._entries: OrderedDict[tuple[int, ...], PrefixKV] = OrderedDict()
        self._ids: dict[str, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every cached prefix."""
        self._entries.clear()
        self._ids.clear()

    def get(self, prefix: str | None) -> PrefixKV | None:
        """The cached KV of a few-shot prefix, computed on first use (None when reuse is off).

        The prefix's last token is left out of the cached part: it may merge with the text that
        follows it (e.g. "\\n\\n" + "Question"), so it is recomputed with each suffix."""
        hf = self.hf
        if prefix is None or not hf.args.prefix_reuse:
            return None
        ids = self._ids.get(prefix)
        if ids is None:
            if len(self._ids) >= MAX_PREFIX_TEXTS:
                self._ids.clear()
            ids = self._ids[prefix] = tuple(hf.tokens.encode(prefix)[:-1])
        if len(ids) < 2 or len(ids) >= hf.max_length // 2:
            return None
        if ids in self._entries:
            self._entries.move_to_end(ids)
            return self._entries[ids]
        cache = hf.new_cache()
        with torch.inference_mode():
            hf.forward(torch.tensor([ids], device=hf.device), cache=cache, logits_to_keep=1)
        entry = PrefixKV(ids=ids, cache=cache)
        self._entries[ids] = entry
        while len(self._entries) > MAX_PREFIXES:
            self._entries.popitem(last=False)
        return entry
