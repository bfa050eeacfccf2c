"""OpenAIArgs: parsed once with one-line errors; base_url checked; seconds kept as written; no httpx."""

from __future__ import annotations

import subprocess
import sys

import pytest

from evals.engines import build_engine, parse_engine_args
from evals.engines.openai_api.args import OpenAIArgs, validate_base_url
from evals.errors import EngineError
from tests.evals.engines.openai_api.fake_server import NO_MODEL


@pytest.mark.parametrize(
    "url,fragment",
    [
        ("ftp://127.0.0.1/v1", "http://HOST:PORT"),
        ("http://user:secret@127.0.0.1/v1", "credentials"),
        ("http://127.0.0.1:8000/v1?key=abc", "query"),
        ("127.0.0.1:8000", "http://HOST:PORT"),
        (None, "base_url: required"),
    ],
)
def test_base_url_is_validated(url: str | None, fragment: str) -> None:
    with pytest.raises(EngineError, match=fragment.replace("?", r"\?")):
        validate_base_url(url)
    assert validate_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"


def test_unknown_argument_and_missing_key_env_are_engine_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EngineError, match="api_key.*did you mean .api_key_env."):
        parse_engine_args("openai", {"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-x"})
    with pytest.raises(EngineError, match="openai engine argument concurrency: .*greater than or equal to 1"):
        parse_engine_args("openai", {"concurrency": 0})
    monkeypatch.delenv("QA_TEST_UNSET_KEY", raising=False)
    with pytest.raises(EngineError, match="QA_TEST_UNSET_KEY"):
        build_engine("openai", NO_MODEL, {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "QA_TEST_UNSET_KEY"})
    with pytest.raises(EngineError, match="base_url: required"):  # a server arm gets it from `qa run`
        build_engine("openai", NO_MODEL, {})


def test_seconds_keep_the_number_type_the_spec_wrote() -> None:
    """An int stays an int: the arm's canonical JSON (its arm.json fingerprint) is what the spec says."""
    args = parse_engine_args("openai", {"timeout_s": 600, "backoff_base_s": 0.25})
    assert isinstance(args, OpenAIArgs)
    assert args.model_dump(exclude_unset=True) == {"timeout_s": 600, "backoff_base_s": 0.25}
    assert type(args.timeout_s) is int and args.backoff_max_s == 30.0
    with pytest.raises(EngineError, match="timeout_s"):
        parse_engine_args("openai", {"timeout_s": 0})


def test_the_args_module_imports_no_http_client() -> None:
    code = "import sys, evals.engines.openai_api.args; print('httpx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
