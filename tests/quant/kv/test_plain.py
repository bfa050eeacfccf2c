"""The plain (unquantized) growable cache: identical to DynamicCache, and row operations that let
sequences be prefilled alone and decoded as one right-aligned batch."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from quant.errors import QuantError
from quant.kv.plain import PlainKVCache, make_plain_cache
from tests.tiny_models import tiny_gemma3_config, tiny_llama, tiny_llama_config

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def gqa_llama():  # -> LlamaForCausalLM
    """The tiny Llama with grouped-query attention (4 heads, 2 KV heads): K/V heads differ from heads."""
    return tiny_llama(num_attention_heads=4, num_key_value_heads=2)


def _greedy(model, cache, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Logits of every decode step [steps, B, vocab] (greedy tokens fed back)."""
    out = []
    with torch.inference_mode():
        logits = model(input_ids=ids, cache=cache, use_cache=True).logits[:, -1:]
        for _ in range(steps):
            out.append(logits[:, -1])
            logits = model(input_ids=logits.argmax(-1), cache=cache, use_cache=True).logits
    return torch.stack(out)


def test_bit_identical_to_dynamic_cache_through_buffer_growth(gqa_llama) -> None:
    ids = torch.randint(1, 128, (3, 20), generator=torch.Generator().manual_seed(2))
    plain = make_plain_cache(gqa_llama.config)
    ref = _greedy(gqa_llama, DynamicCache(config=gqa_llama.config), ids, 80)  # 20 + 80 tokens: 64 -> 128 capacity
    got = _greedy(gqa_llama, plain, ids, 80)
    assert torch.equal(got, ref)
    assert plain.get_seq_length() == 100


def test_crop_select_and_repeat_match_dynamic_cache(gqa_llama) -> None:
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    caches = [DynamicCache(config=gqa_llama.config), make_plain_cache(gqa_llama.config)]
    with torch.inference_mode():
        for cache in caches:
            gqa_llama(input_ids=ids, cache=cache, use_cache=True)
            cache.crop(-3)
            cache.batch_select_indices(torch.tensor([1]))
            cache.batch_repeat_interleave(2)
        nxt = torch.tensor([[5], [6]])
        a, b = (gqa_llama(input_ids=nxt, cache=c, use_cache=True).logits for c in caches)
    assert caches[1].get_seq_length() == 10
    assert torch.equal(a, b)


def _alone(model, ids: list[int], follow: int) -> torch.Tensor:
    """Logits after prefilling ids alone and feeding one more token."""
    cache = make_plain_cache(model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
        return model(input_ids=torch.tensor([[follow]]), cache=cache,
                     position_ids=torch.tensor([[len(ids)]]), use_cache=True).logits[0, -1]


def test_rows_prefilled_alone_then_stacked_decode_like_each_alone(gqa_llama) -> None:
    gen = torch.Generator().manual_seed(4)
    seqs = [torch.randint(1, 128, (n,), generator=gen).tolist() for n in (17, 6, 11)]
    rows = []
    with torch.inference_mode():
        for s in seqs:
            c = make_plain_cache(gqa_llama.config)
            gqa_llama(input_ids=torch.tensor([s]), cache=c, use_cache=True)
            c.pad_left(17 - len(s))
            rows.append(c)
        batch = PlainKVCache.stack(rows)
        mask = torch.tensor([[0] * (17 - len(s)) + [1] * (len(s) + 1) for s in seqs])
        logits = gqa_llama(input_ids=torch.tensor([[9], [9], [9]]), cache=batch, attention_mask=mask,
                       position_ids=torch.tensor([[len(s)] for s in seqs]), use_cache=True).logits[:, -1]
    for i, s in enumerate(seqs):
        torch.testing.assert_close(logits[i], _alone(gqa_llama, s, 9), rtol=0, atol=1e-5)


def test_set_row_refills_a_slot_and_drop_oldest_trims_common_padding(gqa_llama) -> None:
    gen = torch.Generator().manual_seed(5)
    a, b, c = (torch.randint(1, 128, (n,), generator=gen).tolist() for n in (30, 28, 5))
    with torch.inference_mode():
        batch = make_plain_cache(gqa_llama.config)
        pad_b = [1] * 2 + b
        ids = torch.tensor([a, pad_b])
        mask = torch.tensor([[1] * 30, [0] * 2 + [1] * 28])
        gqa_llama(input_ids=ids, cache=batch, attention_mask=mask,
              position_ids=torch.tensor([list(range(30)), [1, 1] + list(range(28))]), use_cache=True)
        row = make_plain_cache(gqa_llama.config)  # the finished row 0 is replaced by c, prefilled alone
        gqa_llama(input_ids=torch.tensor([c]), cache=row, use_cache=True)
        row.pad_left(30 - 5)
        batch.set_row(0, row)
        mask[0] = torch.tensor([0] * 25 + [1] * 5)
        batch.drop_oldest(2)  # both rows have >= 2 leading pads
        mask = mask[:, 2:]
        assert batch.get_seq_length() == 28
        step_mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
        logits = gqa_llama(input_ids=torch.tensor([[9], [9]]), cache=batch, attention_mask=step_mask,
                       position_ids=torch.tensor([[5], [28]]), use_cache=True).logits[:, -1]
    torch.testing.assert_close(logits[0], _alone(gqa_llama, c, 9), rtol=0, atol=1e-5)
    torch.testing.assert_close(logits[1], _alone(gqa_llama, b, 9), rtol=0, atol=1e-5)


def test_sliding_window_models_keep_transformers_layers_and_refuse_row_operations() -> None:
    cache = make_plain_cache(tiny_gemma3_config())
    assert not cache.supports_rows
    with pytest.raises(QuantError, match="sliding-window"):
        cache.pad_left(3)
    assert make_plain_cache(tiny_llama_config()).supports_rows
