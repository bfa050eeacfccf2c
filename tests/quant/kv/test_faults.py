"""Fault presets and the hooks the emulated cache stores through: wrong V scale layouts, code corruption,
multiplied decode scales (pinned bit for bit against independent computations)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from quant.errors import QuantError
from quant.formats.registry import get_format
from quant.kv.cache import make_cache
from quant.kv.faults import FAULT_PRESETS, FaultHooks, fault_hooks, fault_spec
from quant.kv.spec import KVQuantSpec
from tests.tiny_models import TINY_LLAMA, padded_ids, plain_kv

torch.set_num_threads(1)
HEADS = TINY_LLAMA["num_attention_heads"]


def test_fault_presets_are_valid_specs():
    for name in FAULT_PRESETS:
        assert isinstance(fault_spec(name), KVQuantSpec)
    with pytest.raises(QuantError, match="did you mean 'scale_10x'"):
        fault_spec("scale_10")


def test_fault_spec_keeps_base_fields_unless_the_preset_leaves_static_scales(tmp_path):
    base = KVQuantSpec(format="nvfp4", scales="static", scales_file=tmp_path / "s.json", recent_window=8)
    assert fault_spec("scale_10x", base).scales_file == tmp_path / "s.json"
    assert fault_spec("scale_10x", base).recent_window == 8
    uncalibrated = fault_spec("uncalibrated_scale_1", base)
    assert (uncalibrated.scales, uncalibrated.scales_file) == ("constant", None)


def test_hooks_exist_only_where_a_spec_injects_a_fault():
    clean = KVQuantSpec(format="nvfp4")
    assert fault_hooks(clean, 0, "k", "nvfp4") is None and fault_hooks(clean, 0, "v", "nvfp4") is None
    layout = fault_spec("v_scale_layout")
    assert fault_hooks(layout, 0, "k", "nvfp4") is None  # the layout fault is V's
    assert fault_hooks(layout, 1, "v", "nvfp4") == FaultHooks(layer=1, kind="v", scale_layout="reversed")
    corrupt = fault_spec("corrupt_1pct")
    assert fault_hooks(corrupt, 0, "k", "none") is None  # a skipped layer has no codes to corrupt
    assert fault_hooks(corrupt, 0, "k", "nvfp4").alters_bytes
    scaled = fault_hooks(fault_spec("scale_10x"), 0, "k", "nvfp4")
    assert scaled is not None and not scaled.alters_bytes
    assert float(scaled.scale(torch.tensor(0.5))) == 5.0


def test_multiplied_scales(llama):
    ids, _ = padded_ids(batch=1, pad=0)
    c10 = make_cache(llama.config, KVQuantSpec(format="nvfp4", scale_multiplier=10.0))
    with torch.no_grad():
        llama(input_ids=ids, cache=c10, use_cache=True)
    d = plain_kv(llama, ids)[0][1].abs().amax() / 2688.0
    torch.testing.assert_close(c10.layers[0].v.scale.reshape(()), d * 10.0)


@pytest.mark.parametrize("layout", ["reversed", "transposed"])
def test_v_scale_layout_fault_changes_v_only(llama, layout):
    ids, _ = padded_ids(batch=1, pad=0)
    good = make_cache(llama.config, KVQuantSpec(format="nvfp4"))
    bad = make_cache(llama.config, KVQuantSpec(format="nvfp4", v_scale_layout=layout))
    with torch.no_grad():
        llama(input_ids=ids, cache=good, use_cache=True)
        llama(input_ids=ids, cache=bad, use_cache=True)
    for g, b in zip(good.layers[:1], bad.layers[:1]):
        assert torch.equal(g.keys, b.keys)
        assert not torch.equal(g.values, b.values)
        assert torch.equal(g.v.stored()[0].data["scales"], b.v.stored()[0].data["scales"])  # bytes as written
        # the reader's view: scales of (head h, block j) taken from another block of the same token
        s = g.v.stored()[0].data["scales"]  # [1, H, T, nb]
        flat = s.permute(0, 2, 1, 3).reshape(1, s.shape[2], -1)
        read = (
            flat.flip(-1)
            if layout == "reversed"
            else flat.reshape(1, s.shape[2], s.shape[3], HEADS).transpose(-1, -2)
        )
        fixed = read.reshape(1, s.shape[2], HEADS, s.shape[3]).permute(0, 2, 1, 3)
        q = g.v.stored()[0]
        expect = get_format("nvfp4").dequantize(replace(q, data={**q.data, "scales": fixed}))
        assert torch.equal(b.values, expect)


def test_corruption_hits_about_the_requested_share_and_is_seeded(llama):
    ids = torch.randint(1, 128, (1, 64), generator=torch.Generator().manual_seed(5))
    caches = [
        make_cache(llama.config, KVQuantSpec(format="nvfp4", corrupt_block_fraction=0.1, corrupt_seed=s))
        for s in (0, 0, 1)
    ]
    clean = make_cache(llama.config, KVQuantSpec(format="nvfp4"))
    with torch.no_grad():
        for c in (*caches, clean):
            llama(input_ids=ids, cache=c, use_cache=True)
    a, b, other = (c.layers[0].k.stored()[0].data["packed"] for c in caches)
    ref = clean.layers[0].k.stored()[0].data["packed"]
    assert torch.equal(a, b) and not torch.equal(a, other)
    blocks_changed = (a != ref).reshape(1, HEADS, 64, -1, 8).any(-1).float().mean().item()
    assert 0.05 < blocks_changed < 0.15  # 10% of blocks drawn (a few random draws equal the original bytes)
    assert torch.equal(
        caches[0].layers[0].k.stored()[0].data["scales"], clean.layers[0].k.stored()[0].data["scales"]
    )
