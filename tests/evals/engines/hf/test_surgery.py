"""What the engine reads off a model: the split output layer, the cache argument's name and the SDPA
grouped-query switch (restored after use)."""

from __future__ import annotations

import os

import pytest
import torch

from evals.engines.hf.surgery import (
    GQA_ENV,
    cache_keyword,
    gqa_sdpa,
    split_head,
)
from tests.tiny_models import tiny_model


def test_split_head_finds_the_llama_output_layer_unless_logits_are_rescaled() -> None:
    model = tiny_model(300)
    decoder, head = split_head(model)
    assert decoder is model.model and head is model.lm_head
    model.config.logit_scale = 0.5  # Cohere-style scaling after the output layer: no split
    assert split_head(model) == (None, None)
    model.config.logit_scale = 1.0
    assert split_head(model)[0] is not None


def test_cache_keyword_names_the_forward_argument() -> None:
    model = tiny_model(300)
    assert cache_keyword(model) in ("cache", "past_key_values")

    class Old(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None):
            return input_ids

    class New(torch.nn.Module):
        def forward(self, input_ids, cache=None):
            return input_ids

    assert (cache_keyword(Old()), cache_keyword(New())) == ("past_key_values", "cache")


@pytest.mark.parametrize("before", [None, "0"])
def test_gqa_switch_is_set_inside_and_restored_after(monkeypatch, before: str | None) -> None:
    if before is None:
        monkeypatch.delenv(GQA_ENV, raising=False)
    else:
        monkeypatch.setenv(GQA_ENV, before)
    with gqa_sdpa():
        assert os.environ[GQA_ENV] == "1"
    assert os.environ.get(GQA_ENV) == before
