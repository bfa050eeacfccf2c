"""What the engine reads off (or switches on) a loaded transformers model: whether its logits are the
output layer applied to the decoder's last hidden state (so only the rows read need that layer),
the name of its cache argument and SDPA's grouped-query switch."""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

GQA_ENV = "TRANSFORMERS_SDPA_FORCE_GQA"  # read by transformers' sdpa_attention_forward at each call
# config attributes that rescale logits after the output layer (Cohere, Granite, ...): no split
LOGIT_SCALING_ATTRS = ("logit_scale", "logits_scaling", "output_multiplier_scale", "final_logit_scale")


@contextmanager
def gqa_sdpa() -> Iterator[None]:
    """Let transformers' SDPA attention hand grouped K/V heads to torch as they are (enable_gqa) for
    multi-token steps with a padding mask, instead of copying each K/V head once per query head."""
    saved = os.environ.get(GQA_ENV)
    os.environ[GQA_ENV] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(GQA_ENV, None)
        else:
            os.environ[GQA_ENV] = saved


def split_head(model: Any) -> tuple[Any, Any]:
    """(decoder, output layer) when logits are exactly output_layer(decoder last hidden state), up to
    Gemma's final soft cap; (None, None) for any other model (then full forwards are used)."""
    config = model.config
    if any(getattr(config, a, None) not in (None, 1, 1.0) for a in LOGIT_SCALING_ATTRS):
        return None, None
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None, None
    if decoder is None or decoder is model or not isinstance(head, torch.nn.Linear):
        return None, None
    return decoder, head


def cache_keyword(module: Any) -> str:
    """The name of `module.forward`'s cache argument: `cache` in transformers >= 5.2x, else `past_key_values`."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"
