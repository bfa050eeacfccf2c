"""The engine's echo parsing, checked against hand-computed log-probs of the scripted server
(position p has log-prob -p/10; token 0 beats the sent token at even positions), and the refusal of
servers that cannot echo."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.engines.base import (
    GenerateRequest,
    GenerateResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    TokenLogprobs,
    TokenLogprobsRequest,
)
from evals.engines.openai_api.completions import EchoedPrompt, check_echo, parse_echo, token_id
from evals.errors import EngineError
from tests.evals.engines.openai_api.fake_server import CharTokenizer, FakeServer, engine_at


def _loglikelihood(fake: FakeServer, context: str, continuations: tuple[str, ...]) -> LoglikelihoodResult:
    engine = engine_at(fake.base_url, tokenizer=CharTokenizer())
    try:
        [res] = engine.loglikelihood([LoglikelihoodRequest(context=context, continuations=continuations)])
    finally:
        engine.close()
    assert isinstance(res, LoglikelihoodResult)
    return res


def test_loglikelihood_sums_the_continuation_positions(fake: FakeServer) -> None:
    res = _loglikelihood(fake, "abc ", ("de", "f", "g"))
    # context "abc" = positions 0..2; continuation " de" = positions 3..5: -(3+4+5)/10
    assert res.loglikelihoods[0] == pytest.approx(-1.2)
    assert res.loglikelihoods[1] == pytest.approx(-(3 + 4) / 10)
    # token 0 beats the actual token at even positions: " de" covers 4, " f" covers 4, " g" too
    assert res.is_greedy == (False, False, False)
    res2 = _loglikelihood(fake, "ab", ("c",))
    assert res2.loglikelihoods == (pytest.approx(-0.2),) and res2.is_greedy == (False,)
    res3 = _loglikelihood(fake, "a", ("b",))
    assert res3.loglikelihoods == (pytest.approx(-0.1),) and res3.is_greedy == (True,)


def test_empty_context_is_scored_after_the_prefix_token(fake: FakeServer) -> None:
    res = _loglikelihood(fake, "", ("xy",))  # prompt [EOS 3, x, y]: positions 1 and 2
    assert res.loglikelihoods == (pytest.approx(-0.3),)
    sent = [r["prompt"] for r in fake.requests() if not isinstance(r["prompt"], str)]
    assert [3, ord("x"), ord("y")] in sent[-1]


def test_token_logprobs_align_position_t_with_token_t_plus_1(fake: FakeServer) -> None:
    engine = engine_at(fake.base_url, tokenizer=CharTokenizer())
    try:
        [res] = engine.token_logprobs([TokenLogprobsRequest(text="hello", top_k=2, max_tokens=4)])
    finally:
        engine.close()
    assert isinstance(res, TokenLogprobs)
    assert res.target_ids == [ord("e"), ord("l"), ord("l")]  # "hell": max_tokens cuts the "o"
    assert res.target_logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert res.topk_ids == [[ord("e"), 0], [0, ord("l")], [ord("l"), 0]]
    assert res.topk_logprobs[1] == pytest.approx([-0.01, -0.2])


def test_echo_parsing_refuses_short_shifted_or_foreign_echoes() -> None:
    choice = {"logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [None, -0.5],
                           "top_logprobs": [None, {"token_id:6": -0.5}]}}
    echo = parse_echo(choice, 2)
    assert echo == EchoedPrompt(tokens=["token_id:5", "token_id:6"], logprobs=[None, -0.5],
                                top=[None, {"token_id:6": -0.5}])
    check_echo(echo, [5, 6])
    with pytest.raises(ValueError, match="echoed token 6 at position 1, sent 7"):
        check_echo(echo, [5, 7])
    with pytest.raises(ValueError, match="echoed 2 positions for a 3-token prompt"):
        parse_echo(choice, 3)
    with pytest.raises(TypeError, match="no echoed prompt log-probs"):
        parse_echo({"text": "x"}, 1)
    with pytest.raises(ValueError, match="shifted"):
        check_echo(EchoedPrompt(tokens=["a", "b"], logprobs=[-1.0, -2.0], top=[None, None]), [1, 2])
    assert token_id("token_id:42") == 42 and token_id("hello") is None


@pytest.mark.parametrize("mode", ["noecho", "shifted"])
def test_servers_without_a_usable_echo_are_refused(tmp_path: Path, mode: str) -> None:
    server = FakeServer(tmp_path, mode=mode)
    server.start()
    engine = engine_at(server.base_url, tokenizer=CharTokenizer())
    try:
        with pytest.raises(EngineError, match="does not echo"):
            engine.loglikelihood([LoglikelihoodRequest(context="ab", continuations=("c",))])
        with pytest.raises(EngineError, match="does not echo"):  # remembered, not probed again
            engine.token_logprobs([TokenLogprobsRequest(text="abc")])
        assert isinstance(engine.generate([GenerateRequest(prompt="still fine")])[0], GenerateResult)
    finally:
        engine.close()
        server.stop()
    probes = [r for r in server.requests() if not isinstance(r["prompt"], str)]
    assert len(probes) == 1
