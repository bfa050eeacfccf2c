"""The chat endpoint against the scripted server: the posted messages and sampling keys, content and
reasoning parsed back, truncation's finish reason, and the one-line refusals (no messages, scoring,
a key the server would ignore)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.engines.base import (
    GenerateRequest,
    GenerateResult,
    LoglikelihoodRequest,
    Message,
    TokenLogprobsRequest,
)
from evals.engines.openai_api.chat import chat_payload, message_reasoning, parse_chat
from evals.engines.openai_api.sampling import kind_from_models
from evals.errors import EngineError
from tests.evals.engines.openai_api.fake_server import FakeServer, engine_at

MESSAGES = (Message("system", "Be brief."), Message("user", "Say hi"))


def _chat(content: str, **kw: object) -> GenerateRequest:
    return GenerateRequest(prompt="<rendered>", messages=(MESSAGES[0], Message("user", content)), **kw)  # type: ignore[arg-type]


def test_chat_posts_messages_and_parses_content_reasoning_and_length(tmp_path: Path) -> None:
    fake = FakeServer(tmp_path, mode="vllm")
    fake.start()
    engine = engine_at(fake.base_url, api="chat")
    try:
        assert engine.server_kind == "vllm" and engine.info.details["api"] == "chat"
        reqs = [
            _chat("Say hi", until=(" STOP",), max_tokens=7, temperature=0.6, top_p=0.9, top_k=20, min_p=0.05, seed=3,
                  chat_template_kwargs=(("enable_thinking", False),)),
            _chat("THINK: 6x7?", max_tokens=5),
            _chat("CUT: 6x7?", max_tokens=3),
        ]
        plain, think, cut = engine.generate(reqs)
    finally:
        engine.close()
        fake.stop()
    assert plain == GenerateResult(text=" re:Say hi", output_tokens=7, finish_reason="stop")
    assert think == GenerateResult(text=" 42", output_tokens=5, finish_reason="stop", reasoning="6 times 7")
    assert cut == GenerateResult(text="", output_tokens=3, finish_reason="length", reasoning="6 times")
    sent = max(fake.requests(), key=lambda r: r["body"]["max_tokens"])
    assert sent["path"] == "/v1/chat/completions" and sent["prompt"] is None  # messages, not the rendered text
    assert sent["body"] == {
        "model": "fake-model",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}],
        "max_tokens": 7, "temperature": 0.6, "top_p": 0.9, "stop": [" STOP"], "seed": 3, "top_k": 20, "min_p": 0.05,
        "chat_template_kwargs": {"enable_thinking": False}, "skip_special_tokens": True,
    }


def test_chat_refusals_are_one_line_before_anything_is_sent(fake: FakeServer) -> None:
    chat = engine_at(fake.base_url, api="chat")
    completions = engine_at(fake.base_url)
    try:
        assert chat.server_kind == "openai"  # /v1/models names no owner
        with pytest.raises(EngineError, match="set chat = true") as no_messages:
            chat.generate([GenerateRequest(prompt="Say hi")])
        with pytest.raises(EngineError, match="cannot score"):
            chat.loglikelihood([LoglikelihoodRequest(context="a", continuations=("b",))])
        with pytest.raises(EngineError, match="cannot score"):
            chat.token_logprobs([TokenLogprobsRequest(text="abc")])
        with pytest.raises(EngineError, match=r"top_k, min_p set, but .* is a 'openai' server, which ignores them"):
            chat.generate([_chat("x", temperature=1.0, top_k=5, min_p=0.1)])
        with pytest.raises(EngineError, match="chat_template_kwargs set"):
            chat.generate([_chat("x", chat_template_kwargs=(("enable_thinking", True),))])
        with pytest.raises(EngineError, match="min_p set"):  # completions too
            completions.generate([GenerateRequest(prompt="x", temperature=1.0, min_p=0.1)])
        with pytest.raises(EngineError, match="stops at 5 strings; OpenAI's API takes at most 4"):
            completions.generate([GenerateRequest(prompt="x", until=("a", "b", "c", "d", "e"))])
    finally:
        chat.close()
        completions.close()
    assert "\n" not in str(no_messages.value)
    assert fake.requests() == []  # refused before any request


def test_server_kind_named_in_the_arguments_wins(fake: FakeServer) -> None:
    engine = engine_at(fake.base_url, server_kind="llamacpp")
    try:
        assert engine.server_kind == "llamacpp"
        [res] = engine.generate([GenerateRequest(prompt="ab", temperature=1.0, top_k=4, min_p=0.2, max_tokens=2)])
    finally:
        engine.close()
    assert isinstance(res, GenerateResult)
    [sent] = fake.requests()
    assert sent["path"] == "/v1/completions"
    assert (sent["body"]["top_k"], sent["body"]["min_p"]) == (4, 0.2) and "skip_special_tokens" not in sent["body"]


def test_payload_and_parsing_without_a_server() -> None:
    req = _chat("hi", max_tokens=4)
    assert chat_payload(req, "openai") == {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "max_tokens": 4, "temperature": 0.0, "top_p": 1.0,
    }
    assert message_reasoning({"reasoning": "r"}) == "r" and message_reasoning({"content": "c"}) is None
    assert message_reasoning({"reasoning_content": "a", "reasoning": "b"}) == "a"
    body = {"choices": [{"message": {"content": "Answer: 4\n\nQ: next"}, "finish_reason": "stop"}]}
    res = parse_chat(body, _chat("hi", until=("\n\n",)), count_tokens=len)  # no usage: counted locally
    assert res == GenerateResult(text="Answer: 4", output_tokens=9, finish_reason="stop")
    with pytest.raises(TypeError, match="no message"):
        parse_chat({"choices": [{"text": "x"}]}, req, count_tokens=len)
    # llama.cpp's and SGLang's /v1/models bodies name their owners; anything else is OpenAI's API
    assert kind_from_models({"models": [], "data": [{"id": "m", "owned_by": "llamacpp"}]}) == "llamacpp"
    assert kind_from_models({"data": [{"id": "m", "owned_by": "sglang"}]}) == "sglang"
    assert kind_from_models({"data": [{"id": "gpt", "owned_by": "openai"}]}) == "openai"
    assert kind_from_models([]) == "openai"
