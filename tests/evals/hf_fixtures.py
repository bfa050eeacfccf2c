"""hf-engine fixtures: an engine around the tiny random Llama and byte-level BPE of `tests.tiny_models`
(no downloads, a few MB, milliseconds per forward), and SmolLM2-135M when the named model is installed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.tiny_models import tiny_model, tiny_tokenizer


def tiny_engine(args: Mapping[str, Any] | None = None):  # -> HFEngine
    """An HFEngine around the tiny model (no files), with the emulated KV cache when args has `kv`."""
    from evals.engines.hf import read_scales
    from evals.engines.hf.args import parse_args
    from evals.engines.hf.engine import HFEngine

    tok = tiny_tokenizer()
    parsed = parse_args(args or {})
    return HFEngine(tiny_model(len(tok)), tok, parsed, "tiny-llama", scales=read_scales(parsed))


def save_tiny(folder: Path) -> Path:
    """Save the tiny model and tokenizer as an HF folder (for resolve_model / run_arm)."""
    tok = tiny_tokenizer()
    tiny_model(len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def smollm2_or_skip():  # -> ResolvedModel
    """SmolLM2-135M-Instruct when its package is installed, else skip the test."""
    from evals.errors import ModelError
    from evals.models.resolve import resolve_model

    try:
        return resolve_model("smollm2-135m")
    except ModelError as exc:
        pytest.skip(f"SmolLM2 not available: {exc}")


PROMPTS = ("The quick brown fox", "Once upon a time there was a small town by the", "Question: what is 2 + 3? Answer:")


def reference_greedy(engine: Any, prompt: str, n: int) -> tuple[list[int], str]:
    """model.generate on the prompt alone (no padding): generated ids and decoded text."""
    ids = engine.tokenizer(prompt, return_tensors="pt").input_ids
    out = engine.model.generate(ids, max_new_tokens=n, do_sample=False)[0, ids.shape[1]:].tolist()
    return out, engine.tokenizer.decode(out, skip_special_tokens=True)


def direct_loglikelihood(engine: Any, ctx: list[int], cont: list[int]) -> float:
    """Sum of log-probs of `cont` after `ctx` from one plain forward pass of the whole sequence."""
    with torch.no_grad():
        logits = engine.model(torch.tensor([ctx + cont])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return sum(float(lp[len(ctx) - 1 + j, t]) for j, t in enumerate(cont))
