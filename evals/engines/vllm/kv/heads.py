"""Which KV heads a tensor-parallel rank holds in vLLM 0.32, and the per-head static scales sliced to them.

vLLM's rule (model_executor/layers/linear.py `QKVParallelLinear`, the K/V shards its weight loader and
parameter.py `load_qkv_weight` narrow; models/llama.py and its kin size `Attention` from the same division):
with H KV heads over tp ranks, tp <= H gives each rank H / tp consecutive heads, rank r heads
[r * H / tp, (r + 1) * H / tp); tp > H replicates each head over tp / H consecutive ranks, rank r holding
head r // (tp / H). vLLM asserts that one divides the other. A rank's K/V tensors [T, h, D] hold its heads
in that order, so its per-head decode scales are the calibrated [L, H] scales' columns for those heads.
Per-tensor scales apply to every rank unchanged. Torch only, no vllm (the plugin passes the rank).
"""

from __future__ import annotations

from quant.errors import QuantError
from quant.scales.files import TENSOR_NAMES, KVScales


def rank_kv_heads(total_kv_heads: int, tp_size: int, tp_rank: int) -> range:
    """The model's KV heads (indices) that tensor-parallel rank `tp_rank` of `tp_size` holds, in its order."""
    if total_kv_heads < 1 or tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise QuantError(f"no KV heads for rank {tp_rank} of {tp_size} over {total_kv_heads} KV heads")
    if tp_size >= total_kv_heads:  # each head replicated over tp_size / total_kv_heads ranks
        if tp_size % total_kv_heads:
            raise QuantError(f"tensor_parallel_size {tp_size} is not a multiple of the model's "
                             f"{total_kv_heads} KV heads")
        head = tp_rank // (tp_size // total_kv_heads)
        return range(head, head + 1)
    if total_kv_heads % tp_size:
        raise QuantError(f"the model's {total_kv_heads} KV heads do not divide over "
                         f"tensor_parallel_size {tp_size}")
    per_rank = total_kv_heads // tp_size
    return range(tp_rank * per_rank, (tp_rank + 1) * per_rank)


def rank_scales(scales: KVScales | None, total_kv_heads: int, tp_size: int,
                tp_rank: int) -> tuple[KVScales | None, range | None]:
    """(scales as rank `tp_rank` applies them, the model's KV heads they cover): per-head scales [L, H] sliced
    to the rank's heads [L, h] (`rank_kv_heads`), per-tensor scales and None as given with heads None;
    QuantError when per-head scales were calibrated for another number of KV heads than `total_kv_heads`."""
    if scales is None or scales.meta.granularity != "head":
        return scales, None
    if scales.meta.num_kv_heads != total_kv_heads:
        raise QuantError(f"the scales file has {scales.meta.num_kv_heads} KV heads per layer, the model has "
                         f"{total_kv_heads}; calibrate scales for this model")
    heads = rank_kv_heads(total_kv_heads, tp_size, tp_rank)
    if len(heads) == total_kv_heads:
        return scales, heads
    columns = {name: getattr(scales, name)[:, heads.start:heads.stop].contiguous()  # [L, H] -> [L, h]
               for name in TENSOR_NAMES}
    meta = scales.meta.model_copy(update={"num_kv_heads": len(heads)})
    return KVScales(**columns, meta=meta), heads
