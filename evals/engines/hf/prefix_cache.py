"""The hf engine's prefix cache (`kv.prefix_cache = { enabled = true, replay_window = W }`): a served
prompt's KV is kept in the arm's cache format and reused by a later prompt that extends it.

What is kept: after a prompt is prefilled (a generation's prompt; a teacher-forced pass's context and
text), a copy of its cache as it stood at the prompt's last whole block: for an emulated cache the stored bytes (packed NVFP4
codes, block scales, the per-sequence decode scales, the FP8 recent window) exactly as the cache held
them, for format "none" the values; a hit copies them back, nothing is re-quantized or recomputed.
Entries are kept least-recently-used first out within `max_tokens` cached positions; an entry that a
new one extends is replaced by it.

Lookup: the longest common token prefix with any entry, at most up to the first position whose logits
the request needs (so at least one position is computed), rounded down to a multiple of `block`: a
hit of P positions. A hit restores exactly the cache the cached prompt's prefill held when it had
written those P positions: a hit inside an entry crops it, and an emulated cache with an FP8 recent
window rolls back (`quant.kv.stream`: the positions that are again among the last `recent_window`
return in their FP8 bytes, not re-quantized), so the window is the one a pass ending at P holds.
- A model with full-attention layers only: positions [0, P) are read from the cache. Bounded replay
  is refused there (`evals.engines.hf.fit`): vLLM replays only sliding-window KV groups, and on full
  attention a replay recomputes positions whose every input is in the cache.
- A model with sliding-window layers and a replay window W (W at most the smallest window): vLLM's SWA
  bounded replay (`evals.engines.hf.replay`), built for DeepSeek-V4.1's sliding-window layers: the
  global layers read all P positions from the cache and keep them; the sliding layers hold nothing from
  the cache, recompute [P - W, P) and attend to nothing below P - W. A hit with P <= W reuses nothing
  (vLLM does not adopt hits no longer than the window either). Replayed positions differ from a cold
  run's except where they depend only on cached values (the first layer's, when it is a sliding one),
  by design (vLLM: "not bit-identical to a cold run"); with the first layer the only sliding one and
  W >= its window - 1 the cache after a hit is the cold one. vLLM 0.32 replays no Gemma-3 layer: the
  report labels such a run (qa.report.cache_path).
  Without replay, a sliding layer's state exists only at an entry's end (its evicted positions are
  gone), so a hit is a whole entry that the prompt extends (vLLM's retention of the latest prompt
  boundary only, `prefix_cache_retention_interval = 0`).

Passes: a prompt is prefilled as the engine runs it, in passes of up to `prefill_chunk` tokens (vLLM's
max_num_batched_tokens) from its first uncached position, split where an entry is copied (the
prompt's last whole block) and where a replay ends. A cold prompt is one pass up to its last whole
block, a warm one starts at its hit: the passes differ in shape, and a forward over a suffix after a
reused cache differs from one over the whole prompt (measured on CPU in float32, SmolLM2-135M, a
700-token prompt: up to 7e-5 in the logits; the matrix products are blocked by the pass's shape), so
the warm/cold floor of the cache path is measured, not zero by construction. With `prefill_chunk` =
`block` every pass ends at a block boundary and, with no replay, warm == cold bit for bit (tested
over window, block and hit geometries). The FP8 recent window moves once per pass, in the cold path
as in the warm one; with passes longer than a block the positions a hit holds in the window reach the
main format from their FP8 bytes on the warm path and straight from their values on the cold one (rounded
twice vs once: docs/CACHE_PATH.md). Only a batch of one is served this way (each prompt is prefilled alone, as the
continuous-batching decoder does anyway).

Counting (source "counted"): each lookup adds the prompt's tokens to `queried_tokens` and the
positions not recomputed (P - W on a hit) to `hit_tokens`.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from evals.engines.base import PrefixCacheStats
from evals.engines.hf.fit import prefix_cache_problem
from evals.engines.hf.model import HFModel
from evals.engines.hf.replay import emptied, read_only, restarted, unwrap
from evals.errors import EngineError
from quant.errors import QuantError
from quant.kv.shape import SLIDING_LAYER_TYPES, model_kv_shape
from quant.kv.spec import PrefixCacheSpec

STATS_SOURCE = "counted"


@dataclass(frozen=True)
class Served:
    """One prompt prefilled through the prefix cache: its own cache (every position of the prompt), the
    logits [positions asked for, vocab] and how many positions were read from the prefix cache."""

    cache: Any
    logits: torch.Tensor
    cached: int


def prefix_cache_for(hf: HFModel) -> PrefixCache | None:
    """The engine's prefix cache when its kv spec enables one (None otherwise); EngineError when the
    spec cannot work with this model (replay window or block not smaller than the context, a replay
    window larger than a sliding window, or a cache that this model's layers do not fit)."""
    spec = hf.args.kv.prefix_cache if hf.args.kv is not None else None
    if spec is None or not spec.enabled:
        return None
    try:
        hf.new_cache()
        shape = model_kv_shape(hf.model.config)
    except QuantError as exc:  # the spec does not fit the model: say that, not what follows from it
        raise EngineError(f"hf engine: {exc}") from None
    problem = prefix_cache_problem(spec, hf.max_length, shape)
    if problem is not None:
        raise EngineError(problem)
    return PrefixCache(hf, spec)


def common_prefix(a: tuple[int, ...], b: list[int], limit: int) -> int:
    """Length of the longest common prefix of a and b, at most `limit`."""
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def chunk_bounds(start: int, n: int, step: int, cuts: tuple[int, ...] = ()) -> list[tuple[int, int]]:
    """Forward passes [a, b) over positions [start, n) of a prompt: at most `step` tokens each, counted
    from `start` (the first uncached position), and ending at every cut inside (start, n)."""
    out = []
    a = start
    while a < n:
        b = min([n, a + step, *(c for c in cuts if a < c)])
        out.append((a, b))
        a = b
    return out


class PrefixCache:
    """Served prompts' KV by token ids (least recently used first), the lookup, and the counters."""

    def __init__(self, hf: HFModel, spec: PrefixCacheSpec) -> None:
        self.hf = hf
        self.spec = spec
        types = model_kv_shape(hf.model.config).layer_types
        self.sliding = tuple(i for i, t in enumerate(types) if t in SLIDING_LAYER_TYPES)  # layer indices
        self.full = tuple(i for i, t in enumerate(types) if t not in SLIDING_LAYER_TYPES)
        self.entries: OrderedDict[tuple[int, ...], Any] = OrderedDict()  # ids -> cache holding len(ids)
        self.queried_tokens = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def cached_positions(self) -> int:
        """Positions held by all entries."""
        return sum(len(k) for k in self.entries)

    def reset(self) -> None:
        """Forget every entry (the counters keep counting)."""
        self.entries.clear()

    def stats(self) -> PrefixCacheStats:
        """The cumulative lookup and hit counters."""
        return PrefixCacheStats(queried_tokens=self.queried_tokens, hit_tokens=self.hit_tokens, source=STATS_SOURCE)

    @property
    def whole_entries_only(self) -> bool:
        """Whether a hit must be a whole entry: sliding-window layers and no replay to rebuild them."""
        return bool(self.sliding) and self.spec.replay_window == 0

    def match(self, ids: list[int], limit: int) -> tuple[tuple[int, ...] | None, int]:
        """(entry, P): the entry sharing the longest prefix with ids (at most `limit` tokens), P that
        prefix rounded down to whole blocks (the whole entry when `whole_entries_only`); (None, 0)
        when no block matches."""
        best, best_n = None, 0
        for key in self.entries:
            n = common_prefix(key, ids, limit)
            if self.whole_entries_only and n < len(key):
                continue
            if n > best_n:
                best, best_n = key, n
        hit = best_n // self.spec.block * self.spec.block
        return (best, hit) if hit else (None, 0)

    def lookup(self, ids: list[int], limit: int) -> tuple[Any, int, int]:
        """(cache, read, hit) for a prompt: a private cache holding the positions taken from the longest
        cached prefix, as the cached prompt's prefill held them (`read` = hit minus the replay window are
        not recomputed; on a replay the global layers hold all `hit`, the sliding ones start empty at
        `read`), or a fresh cache with (0, 0). Counted."""
        key, hit = self.match(ids, limit)
        read = max(0, hit - self.spec.replay_window)
        self.queried_tokens += len(ids)
        if key is None or read == 0:
            return self.hf.new_cache(), 0, 0
        self.entries.move_to_end(key)
        cache = copy.deepcopy(self.entries[key])
        if read < hit:  # SWA bounded replay (fit refuses a replay on a model without sliding layers)
            _crop(cache, self.full, len(key) - hit)
            for i in self.sliding:
                cache.layers[i] = restarted(cache.layers[i], read)
        else:
            _crop(cache, range(len(cache.layers)), len(key) - hit)
        self.hit_tokens += read
        return cache, read, hit

    def store(self, ids: list[int], cache: Any) -> None:
        """Keep a copy of `cache`, which holds exactly the whole blocks `ids`, replacing the entries it
        extends (sliding layers kept empty when a replay rebuilds them); then drop the least recently
        used entries beyond `max_tokens` positions."""
        keep = len(ids)
        assert keep % self.spec.block == 0
        if keep == 0 or keep > self.spec.max_tokens:
            return
        key = tuple(ids)
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        for old in [k for k in self.entries if len(k) < keep and key[: len(k)] == k]:
            del self.entries[old]
        kept = copy.deepcopy(cache)
        for i in range(len(kept.layers)):
            if i in self.sliding and self.spec.replay_window:
                kept.layers[i] = emptied(kept.layers[i])  # a replay rebuilds it; only its scales are read
            else:
                kept.layers[i] = unwrap(kept.layers[i])
        self.entries[key] = kept
        total = self.cached_positions
        while total > self.spec.max_tokens:
            old, _ = self.entries.popitem(last=False)
            total -= len(old)

    @torch.inference_mode()
    def serve(self, ids: list[int], first: int, last: int) -> Served:
        """Prefill `ids` reusing the longest cached prefix that ends at or before position `first`, return
        the logits at positions [first, last) (position t predicts ids[t + 1]) and keep the prompt's KV."""
        hf = self.hf
        assert 0 <= first < last <= len(ids)
        cache, read, hit = self.lookup(ids, first)
        keep = len(ids) // self.spec.block * self.spec.block
        x = torch.tensor([ids], dtype=torch.long, device=hf.device)
        parts: list[torch.Tensor] = []
        cuts = (keep, hit) if self.sliding and hit > read else (keep,)
        for a, b in chunk_bounds(read, len(ids), hf.args.prefill_chunk, cuts):
            pos = torch.arange(a, b, device=hf.device)[None, :]
            lo, hi = max(a, first), min(b, last)
            swa_replay = bool(self.sliding) and b <= hit  # global layers read the cache, sliding ones rebuild
            with read_only(cache, self.full, a) if swa_replay else nullcontext():
                if hi > lo:
                    parts.append(hf.span_logits(x[:, a:b], [(0, lo - a, hi - lo)], cache=cache,
                                                position_ids=pos)[0])
                else:
                    hf.forward(x[:, a:b], cache=cache, position_ids=pos, logits_to_keep=1)
            if b == keep:
                self.store(ids[:keep], cache)
        return Served(cache=cache, logits=torch.cat(parts), cached=read)


def _crop(cache: Any, layers: Any, n: int) -> None:
    """Forget the n newest positions of the given layers of one of the engine's caches."""
    if n > 0:
        for i in layers:
            cache.layers[i].crop(-n)  # our cache layers take the (negative) number of positions to remove
