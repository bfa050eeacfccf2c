"""One generated sequence: argmax or a seeded draw (vLLM's filters: min_p, top-k, top-p), stop checks on a token
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
    sampling_logits,
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


def test_sampling_filters_in_vllm_order_hand_computed() -> None:
    # probabilities at temperature 1: softmax([4, 3, 2, 1, 1, 0]) = .617 .227 .083 .031 .031 .011
    row = torch.tensor([1.0, 4.0, 0.0, 3.0, 1.0, 2.0])
    inf = float("-inf")

    def kept(**kw: float) -> list[bool]:
        out = sampling_logits(row, GenerateRequest(prompt="", temperature=kw.pop("temperature", 1.0), **kw))
        return [bool(v > inf) for v in out.tolist()]

    assert kept() == [True] * 6
    assert kept(top_k=2) == [False, True, False, True, False, False]
    assert kept(top_k=4) == [True, True, False, True, True, True]  # the 4th largest (1.0) is tied: both kept
    assert kept(top_k=6) == kept(top_k=0) == [True] * 6  # k >= vocab is off, as vLLM
    assert kept(min_p=0.3) == [False, True, False, True, False, False]  # .227 >= .3 x .617 = .185; .083 is not
    # top_p over the tokens left: top_k=3 renormalises 4/3/2 to .665 .245 .090; 0.8 drops .090 only
    assert kept(top_k=3, top_p=0.8) == [False, True, False, True, False, False]
    assert kept(top_p=1e-6) == [False, True, False, False, False, False]  # never drops the top token
    # min_p reads the probabilities after temperature: at T=0.5 the 3.0 token is e^-2 = .135 of the top (< .3)
    assert kept(min_p=0.3, temperature=0.5) == [False, True, False, False, False, False]
    scaled = sampling_logits(row, GenerateRequest(prompt="", temperature=0.5))
    assert torch.equal(scaled, row / 0.5)


def test_seeded_top_k_draws_only_the_top_k() -> None:
    logits = torch.zeros(1, 50)
    logits[0, 7], logits[0, 30] = 5.0, 4.0
    req = GenerateRequest(prompt="", temperature=3.0, top_k=2, seed=11)
    gen = sampler(req, torch.device("cpu"))
    draws = {pick(logits, [req], [gen])[0] for _ in range(40)}
    assert draws == {7, 30}  # both drawn at T=3, nothing else ever
    again = sampler(req, torch.device("cpu"))
    gen2 = sampler(req, torch.device("cpu"))
    assert [pick(logits, [req], [again])[0] for _ in range(5)] == [pick(logits, [req], [gen2])[0] for _ in range(5)]
