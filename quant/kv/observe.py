"""A plain DynamicCache that shows every K/V write to an observer (calibration and kv-inspect)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

KVObserver = Callable[[int, torch.Tensor, torch.Tensor], None]  # (layer, K, V), each [B, H, n, D]


class ObservingCache(DynamicCache):
    """A plain DynamicCache showing each written K/V [B, H, n, D] (after RoPE) to `observer(layer, k, v)`."""

    def __init__(self, config: Any, observer: KVObserver) -> None:
        super().__init__(config=config)
        self.observer = observer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Observe, then store and return unchanged (the model's outputs are not affected)."""
        self.observer(layer_idx, key_states, value_states)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)
