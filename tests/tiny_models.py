"""Tiny random models for CPU tests (no downloads, milliseconds per forward): the one place they are built.

- `tiny_llama`: a 2-layer Llama (hidden 64, 2 heads of dim 32, vocab 128) with transformers' own random
  init from `seed`; keyword overrides change the config (e.g. `num_key_value_heads=1` for GQA).
- `tiny_gemma3`: the same size with one sliding-window layer (window 6) and one full-attention layer.
- `tiny_tokenizer` + `tiny_model`: a 300-token byte-level BPE and a Llama sized to it whose weights are
  N(0, 0.3^2) from `seed`, for engine plumbing tests (peaked logits: greedy ties are vanishingly unlikely).
- `plain_kv`: the K/V a plain DynamicCache holds after one forward (the reference the caches are checked on).
- `tiny_family(name)`: a 2-layer random model of one transformers family of the architecture matrix
  (TINY_FAMILIES, docs/KV_ARCHITECTURES.md): windows of 6 where the family has sliding layers, MoE with 4
  experts, MLA with latent 32 and rope 16, qwen3_next with one linear-attention layer.

Seeds go to a forked RNG: building a model never changes the global torch RNG state.
"""

from __future__ import annotations

from typing import Any

import torch

CORPUS = (
    "The quick brown fox jumps over the lazy dog. Question: what is 2 + 3? Answer: 5.\n\n"
    "Once upon a time there was a small town by the river, and the people there liked bread.\n"
)
TINY_LLAMA: dict[str, Any] = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "pad_token_id": 0,
}
TINY_GEMMA3: dict[str, Any] = {
    **TINY_LLAMA,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "sliding_window": 6,
    "layer_types": ["sliding_attention", "full_attention"],
}
ENGINE_STD = 0.3  # weight scale of `tiny_model`
TINY_BASE: dict[str, Any] = {  # every family: 2 layers, 4 query heads and 2 KV heads of dim 16
    **TINY_LLAMA, "num_attention_heads": 4, "head_dim": 16, "bos_token_id": 1, "eos_token_id": 2,
}
_MOE: dict[str, Any] = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
_MLA: dict[str, Any] = {
    "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16, "num_key_value_heads": 4,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
    "n_group": 1, "topk_group": 1,
}
SLIDING_PAIR: dict[str, Any] = {"sliding_window": 6, "layer_types": ["sliding_attention", "full_attention"]}
TINY_FAMILIES: dict[str, dict[str, Any]] = {  # model_type -> config overrides of TINY_BASE
    "llama": {},
    "mistral": {"sliding_window": 6},  # every layer sliding (Mistral-7B-v0.1's 4096 window)
    "qwen2": {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1},  # full, sliding
    "qwen3": {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1},
    "qwen3_moe": {**_MOE, "decoder_sparse_step": 1},
    "phi3": {"sliding_window": 6},  # every layer sliding (Phi-3-mini's 2047 window)
    "gemma2": {"sliding_window": 6},  # local, global; attention logit soft cap 50
    "gemma3_text": SLIDING_PAIR,
    "gpt_oss": {**SLIDING_PAIR, "num_local_experts": 4, "num_experts_per_tok": 2,
                "rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}},  # attention sinks
    "deepseek_v3": {**_MLA, "q_lora_rank": 32},
    "deepseek_v2": {**_MLA, "q_lora_rank": None},
    "granite": {},  # residual, attention and logit multipliers
    "olmo2": {},  # q/k RMS norms
    "qwen3_next": {**_MOE, "layer_types": ["linear_attention", "full_attention"], "linear_num_value_heads": 2,
                   "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16},
}


def tiny_llama_config(**overrides: Any):  # -> LlamaConfig
    """TINY_LLAMA with `overrides` applied."""
    from transformers import LlamaConfig

    return LlamaConfig(**{**TINY_LLAMA, **overrides})


def tiny_gemma3_config(**overrides: Any):  # -> Gemma3TextConfig
    """TINY_GEMMA3 with `overrides` applied."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(**{**TINY_GEMMA3, **overrides})


def _built(cls: Any, config: Any, seed: int) -> Any:
    """cls(config) in eval mode, its random init drawn from a forked RNG seeded with `seed`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(config).eval()


def tiny_llama(seed: int = 0, **overrides: Any):  # -> LlamaForCausalLM
    """A random tiny Llama (transformers' init from `seed`), config TINY_LLAMA with `overrides`."""
    from transformers import LlamaForCausalLM

    return _built(LlamaForCausalLM, tiny_llama_config(**overrides), seed)


def tiny_gemma3(seed: int = 0, **overrides: Any):  # -> Gemma3ForCausalLM
    """A random tiny Gemma-3 text model (one sliding-window layer), config TINY_GEMMA3 with `overrides`."""
    from transformers import Gemma3ForCausalLM

    return _built(Gemma3ForCausalLM, tiny_gemma3_config(**overrides), seed)


def tiny_family_config(name: str, **overrides: Any):  # -> PreTrainedConfig
    """The config of TINY_FAMILIES[name] over TINY_BASE, with `overrides` applied."""
    from transformers import AutoConfig

    return AutoConfig.for_model(name, **{**TINY_BASE, **TINY_FAMILIES[name], **overrides})


def tiny_family(name: str, seed: int = 0, **overrides: Any):  # -> PreTrainedModel
    """A random causal LM of family `name` (transformers' init from `seed`), config `tiny_family_config`."""
    from transformers import AutoModelForCausalLM

    return _built(AutoModelForCausalLM.from_config, tiny_family_config(name, **overrides), seed)


def tiny_tokenizer():  # -> PreTrainedTokenizerFast
    """A 300-token byte-level BPE trained on CORPUS, with <s> (BOS) and </s> (EOS = pad)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator([CORPUS] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="</s>")


def tiny_model(vocab_size: int, seed: int = 0):  # -> LlamaForCausalLM
    """2 layers, hidden 64, 4 heads (2 KV heads) of dim 16, weights N(0, ENGINE_STD^2) from `seed`."""
    from transformers import GenerationConfig, LlamaForCausalLM

    config = tiny_llama_config(vocab_size=vocab_size, num_attention_heads=4, num_key_value_heads=2,
                               bos_token_id=0, eos_token_id=1, pad_token_id=1)
    model = _built(LlamaForCausalLM, config, seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * ENGINE_STD)
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return model


def plain_kv(model: Any, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(K, V) [B, H, T, D] of every layer after one forward of ids [B, T] through a plain DynamicCache."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, cache=cache, use_cache=True)
    return [(layer.keys, layer.values) for layer in cache.layers]


def padded_ids(batch: int = 2, length: int = 12, pad: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [batch, length] in 1..127 from seed 1, attention mask): row 0 left-padded with `pad` zeros."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 128, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :pad] = 0  # left padding on the first row
    ids[0, :pad] = 0
    return ids, mask
