"""A tiny random Llama with a self-made byte-level BPE tokenizer, for hf-engine plumbing tests (no
downloads, a few MB, milliseconds per forward), and SmolLM2-135M when the named model is installed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

CORPUS = (
    "The quick brown fox jumps over the lazy dog. Question: what is 2 + 3? Answer: 5.\n\n"
    "Once upon a time there was a small town by the river, and the people there liked bread.\n"
)


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
    """2 layers, hidden 64, 4 heads (2 KV heads) of dim 16, random weights from `seed`."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=0, eos_token_id=1, pad_token_id=1)
    gen = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():  # std 0.3: peaked enough that greedy ties are vanishingly unlikely
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return model.eval()


def tiny_engine(args: Mapping[str, Any] | None = None):  # -> HFEngine
    """An HFEngine around the tiny model (no files), with the emulated KV cache when args has `kv`."""
    from evals.engines.hf import HFEngine, _kv_spec, parse_args

    tok = tiny_tokenizer()
    parsed = parse_args(args or {})
    spec, scales = _kv_spec(parsed.kv, parsed.scales)
    return HFEngine(tiny_model(len(tok)), tok, parsed, "tiny-llama", kv_spec=spec, scales=scales)


def save_tiny(folder: Path) -> Path:
    """Save the tiny model and tokenizer as an HF folder (for resolve_model / run_arm)."""
    tok = tiny_tokenizer()
    tiny_model(len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def smollm2_or_skip():  # -> ResolvedModel
    """SmolLM2-135M-Instruct when its package is installed, else skip the test."""
    from evals.errors import ModelError
    from evals.models import resolve_model

    try:
        return resolve_model("smollm2-135m")
    except ModelError as exc:
        pytest.skip(f"SmolLM2 not available: {exc}")
