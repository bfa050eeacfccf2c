"""Per-head static scales under tensor parallelism (no vllm needed): the KV heads each rank holds, by vLLM
0.32's rule written out here by hand (QKVParallelLinear: H / tp consecutive heads per rank, or each head
replicated over tp / H ranks), the scales sliced to them bit for bit, and the ranks' records joined back
into one record holding every head's scales (a rank that disagrees on a head it shares is refused)."""

from __future__ import annotations

import pytest
import torch

from evals.engines.vllm.kv.heads import rank_kv_heads, rank_scales
from evals.engines.vllm.kv.record import ExpectedLoads, PluginRecord, RewrittenLayer, checked_record
from evals.errors import EngineError
from quant.errors import QuantError
from quant.formats.registry import get_format
from quant.scales.files import CalibrationData, KVScales, ScalesMeta

LAYERS, HEADS = 2, 4


def _scales(granularity: str = "head", heads: int = HEADS) -> KVScales:
    """nvfp4 scales with a distinct amax for every (layer, head): 1 + layer + head / 10 (K), twice that (V)."""
    fmt = get_format("nvfp4")
    k_amax = 1.0 + torch.arange(LAYERS, dtype=torch.float32).reshape(-1, 1) + torch.arange(heads) / 10  # [L, H]
    k_amax = (k_amax if granularity == "head" else k_amax[:, 0]).contiguous()  # [L, H] or [L]
    v_amax = 2 * k_amax
    meta = ScalesMeta(format="nvfp4", convention="decode", observer="absmax", granularity=granularity,  # type: ignore[arg-type]
                      num_layers=LAYERS, num_kv_heads=heads, model="tiny",
                      data=CalibrationData(name="t", sha256="0", n_samples=1, seq_len=8), seed=0)
    return KVScales(k_amax=k_amax, v_amax=v_amax, k_scale=fmt.decode_scale_from_amax(k_amax),
                    v_scale=fmt.decode_scale_from_amax(v_amax), meta=meta)


@pytest.mark.parametrize(("total", "tp", "want"), [
    (4, 1, [[0, 1, 2, 3]]),
    (4, 2, [[0, 1], [2, 3]]),
    (4, 4, [[0], [1], [2], [3]]),
    (8, 4, [[0, 1], [2, 3], [4, 5], [6, 7]]),
    (2, 4, [[0], [0], [1], [1]]),  # tp > H: each head on tp / H consecutive ranks
    (1, 2, [[0], [0]]),  # MQA / an MLA latent: every rank holds the one head
    (3, 6, [[0], [0], [1], [1], [2], [2]]),
])
def test_each_rank_holds_vllms_kv_heads(total: int, tp: int, want: list[list[int]]) -> None:
    assert [list(rank_kv_heads(total, tp, rank)) for rank in range(tp)] == want


@pytest.mark.parametrize(("total", "tp"), [(4, 3), (3, 2), (2, 3)])
def test_heads_that_do_not_divide_are_refused(total: int, tp: int) -> None:
    with pytest.raises(QuantError, match="tensor_parallel_size"):
        rank_kv_heads(total, tp, 0)


def test_per_head_scales_are_sliced_to_the_ranks_heads_bit_for_bit() -> None:
    full = _scales()
    for rank, heads in enumerate(([0, 1], [2, 3])):
        mine, held = rank_scales(full, HEADS, 2, rank)
        assert mine is not None and held is not None and list(held) == heads
        assert mine.meta.num_kv_heads == 2 and mine.meta.granularity == "head"
        for name in ("k_amax", "v_amax", "k_scale", "v_scale"):
            assert torch.equal(getattr(mine, name), getattr(full, name)[:, heads])
        for layer in range(LAYERS):  # the amax each layer plan derives its [h, 1] decode scales from
            assert torch.equal(mine.amax(layer, "k"), full.amax(layer, "k")[:, heads])
    replicated, held = rank_scales(full, HEADS, 8, 5)  # tp 8 over 4 heads: rank 5 holds head 2
    assert replicated is not None and held == range(2, 3)
    assert torch.equal(replicated.k_scale, full.k_scale[:, 2:3])


def test_per_tensor_scales_and_no_scales_apply_to_every_rank_unchanged() -> None:
    tensor, full = _scales("tensor"), _scales()
    same, held = rank_scales(tensor, HEADS, 2, 1)
    assert same is tensor and held is None
    assert rank_scales(None, HEADS, 2, 1) == (None, None)
    same, held = rank_scales(full, HEADS, 1, 0)  # one rank holds every head: the scales as they are
    assert same is full and held == range(HEADS)


def test_per_head_scales_of_another_head_count_are_refused() -> None:
    with pytest.raises(QuantError, match="the scales file has 4 KV heads per layer, the model has 8"):
        rank_scales(_scales(), 8, 2, 0)


def _rank_record(pid: int, heads: list[int], k: list[float], v: list[float]) -> PluginRecord:
    layers = [RewrittenLayer(name=f"model.layers.{i}.self_attn.attn", layer=i, kind="attention", format="nvfp4",
                             k_scale=[x + i for x in k], v_scale=[x + i for x in v], kv_heads=heads)
              for i in range(LAYERS)]
    return PluginRecord(vllm="0.32.0", pid=pid, spec={"format": "nvfp4"}, layers=layers)


def test_the_ranks_records_join_into_every_heads_scales() -> None:
    ranks = [_rank_record(10, [0, 1], [0.1, 0.2], [1.1, 1.2]), _rank_record(11, [2, 3], [0.3, 0.4], [1.3, 1.4])]
    joined = checked_record(ranks, ExpectedLoads(processes=2, stages=1), "vllm")
    for i, layer in enumerate(joined.layers):
        assert layer.kv_heads == [0, 1, 2, 3]
        assert layer.k_scale == [0.1 + i, 0.2 + i, 0.3 + i, 0.4 + i]
        assert layer.v_scale == [1.1 + i, 1.2 + i, 1.3 + i, 1.4 + i]
    one = _rank_record(10, [0, 1, 2, 3], [0.1, 0.2, 0.3, 0.4], [1.1, 1.2, 1.3, 1.4])  # TP=1 records the same
    assert checked_record([one], ExpectedLoads(processes=1, stages=1), "vllm").layers == joined.layers


def test_replicated_heads_join_once_and_must_agree() -> None:
    same = [_rank_record(10, [0], [0.1], [1.1]), _rank_record(11, [0], [0.1], [1.1]),
            _rank_record(12, [1], [0.2], [1.2]), _rank_record(13, [1], [0.2], [1.2])]
    joined = checked_record(same, ExpectedLoads(processes=4, stages=1), "vllm")
    assert joined.layers[0].kv_heads == [0, 1] and joined.layers[0].k_scale == [0.1, 0.2]
    differ = [*same[:3], _rank_record(13, [1], [0.25], [1.2])]  # rank 3 rewrote head 1 with another scale
    with pytest.raises(EngineError, match="records disagree"):
        checked_record(differ, ExpectedLoads(processes=4, stages=1), "vllm")


def test_a_rank_without_per_head_scales_beside_ranks_with_them_is_refused() -> None:
    per_tensor = PluginRecord(vllm="0.32.0", pid=11, spec={"format": "nvfp4"}, layers=[
        RewrittenLayer(name=f"model.layers.{i}.self_attn.attn", layer=i, kind="attention", format="nvfp4",
                       k_scale=[0.3 + i], v_scale=[1.3 + i]) for i in range(LAYERS)])
    with pytest.raises(EngineError, match="records disagree"):
        checked_record([_rank_record(10, [0, 1], [0.1, 0.2], [1.1, 1.2]), per_tensor],
                       ExpectedLoads(processes=2, stages=1), "vllm")
