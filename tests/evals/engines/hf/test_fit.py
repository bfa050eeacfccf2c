"""evals.engines.hf.fit: a kv spec checked against a model's config alone, the same refusals the engine makes
at build time, and the context window as lm-eval resolves it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evals.engines.hf.args import HFEngineArgs
from evals.engines.hf.fit import DEFAULT_MAX_LENGTH, check_config_fit, context_window
from evals.errors import EngineError
from tests.tiny_models import tiny_family_config, tiny_gemma3_config, tiny_llama_config

WINDOW = 6  # TINY_GEMMA3's sliding window


def args(**prefix: object) -> HFEngineArgs:
    """hf engine args with an unquantized emulated cache and the prefix cache `prefix`."""
    return HFEngineArgs.model_validate({"kv": {"format": "none", "prefix_cache": {"block": 2, **prefix}}})


def test_context_window_as_lm_eval_resolves_it() -> None:
    tok = SimpleNamespace(model_max_length=512)
    assert context_window(SimpleNamespace(max_position_embeddings=256), tok) == 256
    assert context_window(SimpleNamespace(n_positions=1024, max_position_embeddings=256), tok) == 1024
    assert context_window(SimpleNamespace(), tok) == 512
    assert context_window(SimpleNamespace(), SimpleNamespace(model_max_length=10**30)) == DEFAULT_MAX_LENGTH
    assert context_window(SimpleNamespace(), None) == DEFAULT_MAX_LENGTH


def test_a_replay_window_up_to_the_sliding_window_fits_and_one_more_is_refused() -> None:
    config = tiny_gemma3_config()
    check_config_fit(config, args(replay_window=WINDOW))
    with pytest.raises(EngineError, match=r"replay_window 7 is larger than the model's sliding window \(6 "):
        check_config_fit(config, args(replay_window=WINDOW + 1))


def test_windows_that_do_not_fit_the_context_are_refused() -> None:
    config = tiny_llama_config(max_position_embeddings=64)
    with pytest.raises(EngineError, match="replay_window 64 is larger than the model context"):
        check_config_fit(config, args(replay_window=64))
    with pytest.raises(EngineError, match="block 64 is not smaller than the model context"):
        check_config_fit(config, HFEngineArgs.model_validate({"kv": {"format": "none", "prefix_cache": {"block": 64}}}))
    check_config_fit(config, HFEngineArgs.model_validate({"max_length": 128, "kv": {
        "format": "none", "prefix_cache": {"block": 64}}}))  # the arm's own max_length decides


def test_a_replay_on_a_model_without_sliding_layers_is_refused_in_one_line() -> None:
    with pytest.raises(EngineError, match="replay_window 8 needs a model with sliding-window layers") as info:
        check_config_fit(tiny_llama_config(), args(replay_window=8))
    assert "\n" not in str(info.value)
    check_config_fit(tiny_llama_config(), args())  # no replay: the prefix cache runs


def test_a_hybrid_model_runs_the_cache_but_not_the_prefix_cache() -> None:
    config = tiny_family_config("qwen3_next")
    check_config_fit(config, HFEngineArgs.model_validate({"kv": {"format": "nvfp4"}}))
    with pytest.raises(EngineError, match="linear_attention") as info:
        check_config_fit(config, args())
    assert "\n" not in str(info.value)


def test_an_arm_without_a_kv_spec_is_not_checked() -> None:
    check_config_fit(SimpleNamespace(), HFEngineArgs())
