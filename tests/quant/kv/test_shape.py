"""Model-shape introspection: layer types, windows, KV heads and head_dim; unsupported models refused."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig, T5Config

from quant.errors import QuantError
from quant.kv.cache import make_cache
from quant.kv.plain import make_plain_cache
from quant.kv.shape import model_kv_shape
from quant.kv.spec import KVQuantSpec
from tests.tiny_models import tiny_gemma3_config, tiny_llama_config


def test_llama_and_gemma3_shapes():
    llama = model_kv_shape(tiny_llama_config(num_attention_heads=4, num_key_value_heads=1))
    assert (llama.layer_types, llama.sliding_windows) == (("full_attention",) * 2, (None, None))
    assert (llama.num_kv_heads, llama.head_dim) == (1, 16)  # hidden 64 / 4 heads
    gemma = model_kv_shape(tiny_gemma3_config())
    assert gemma.layer_types == ("sliding_attention", "full_attention")
    assert gemma.sliding_windows == (6, None) and (gemma.num_kv_heads, gemma.head_dim) == (1, 32)


def test_encoder_decoder_and_unknown_layer_types_are_refused():
    with pytest.raises(QuantError, match="encoder-decoder"):
        model_kv_shape(T5Config())
    hybrid = LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=64, vocab_size=10
    )
    hybrid.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(QuantError, match="linear_attention"):
        model_kv_shape(hybrid)


def test_sliding_layers_without_a_window_size_are_refused_by_both_caches() -> None:
    cfg = tiny_gemma3_config()
    cfg.get_text_config(decoder=True).sliding_window = None
    for build in (model_kv_shape, make_plain_cache, lambda c: make_cache(c, KVQuantSpec())):
        with pytest.raises(QuantError, match="no window size"):
            build(cfg)
