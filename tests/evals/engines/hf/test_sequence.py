"""One generated sequence: argmax or a seeded draw (top-p as transformers), stop checks on a token
window, and the result cut at the earliest stop string."""

from __future__ import annotations

import pytest
import torch

from evals.engines.base import GenerateRequest
from evals.engines.hf.sequence import (
    STOP_WINDOW_EXTRA,
    finish,
    has_stop,
    pick,
    sampler,
    step_result,
    stop_window,
)
from evals.engines.hf.tokens import HFTokens
from tests.tiny_models import tiny_tokenizer


@pytest.fixture(scope="module")
def tok() -> HFTokens:
    return HFTokens(tiny_tokenizer(), None, add_bos_token=None)


def test_pick_is_argmax_for_greedy_rows_and_seeded_for_sampled_ones() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, -1.0], [1.0, 0.5, 0.0, 2.0]])
    greedy = GenerateRequest(prompt="")
    assert pick(logits, [greedy, greedy], [None, None]) == [1, 3]  # first index on ties
    hot = GenerateRequest(prompt="", temperature=1.0, seed=5)
    draws = [pick(logits, [greedy, hot], [None, sampler(hot, torch.device("cpu"))])[1] for _ in range(3)]
    assert len(set(draws)) == 1  # the same seed draws the same token
    assert sampler(greedy, torch.device("cpu")) is None
    narrow = GenerateRequest(prompt="", temperature=1.0, top_p=1e-6, seed=1)
    assert pick(logits[1:], [narrow], [sampler(narrow, torch.device("cpu"))]) == [3]  # top-p keeps the argmax only


def test_stop_checks_and_results_cut_at_the_earliest_stop_string(tok: HFTokens) -> None:
    ids = tok.encode("the fox jumps over the lazy dog")
    req = GenerateRequest(prompt="", until=("lazy", "fox"), max_tokens=50)
    assert stop_window(req) == 4 + STOP_WINDOW_EXTRA
    assert has_stop(tok, ids, req.until, len(ids))
    assert not has_stop(tok, ids, ("cat",), len(ids))
    res = finish(tok, req, ids, len(ids), "stop")
    assert (res.text, res.output_tokens, res.finish_reason) == ("the ", len(ids), "stop")


def test_step_result_ends_a_sequence_at_eos_stop_or_max_tokens(tok: HFTokens) -> None:
    ids = tok.encode("the fox")
    req = GenerateRequest(prompt="", max_tokens=len(ids) + 2)
    assert step_result(tok, req, list(ids), stop_window(req)) is None
    eos = step_result(tok, req, [*ids, tok.tokenizer.eos_token_id], stop_window(req))
    assert eos is not None and (eos.text, eos.output_tokens, eos.finish_reason) == ("the fox", len(ids) + 1, "stop")
    short = GenerateRequest(prompt="", max_tokens=len(ids))
    length = step_result(tok, short, list(ids), stop_window(short))
    assert length is not None and (length.text, length.finish_reason) == ("the fox", "length")
    stop = GenerateRequest(prompt="", until=("fox",), max_tokens=50)
    assert step_result(tok, stop, list(ids), stop_window(stop)).text == "the "  # type: ignore[union-attr]
