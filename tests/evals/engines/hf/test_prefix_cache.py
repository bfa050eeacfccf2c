"""The hf engine's prefix cache: block-aligned hits counted per request and in total, the served KV
kept as the cache held it (NVFP4 bytes included), the LRU token budget, and the bad inputs. The
warm == cold fact (format none, passes of one block) is checked on the tiny model and on SmolLM2-135M;
the sweep over windows, blocks and replays: test_cache_path_sweep.py. Models with sliding-window
layers: test_swa_replay.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from evals.engines.base import (
    GenerateRequest,
    GenerateResult,
    PrefixCacheControl,
    TokenLogprobsRequest,
)
from evals.engines.hf.args import parse_args
from evals.engines.hf.prefix_cache import chunk_bounds, common_prefix
from evals.errors import EngineError
from quant.kv.spec import KVQuantSpec
from tests.evals.hf_fixtures import smollm2_or_skip, tiny_engine
from tests.shared_data import shared_data_dir

BLOCK = 8
PROMPT = "The quick brown fox jumps over the lazy dog. Question: what is 2 + 3? Answer:"
MORE = " 5.\n\nOnce upon a time there was a small town by the river, and the people"


def cached_engine(**prefix_cache: object):  # -> HFEngine, prefilling in passes of one block
    return tiny_engine({"prefill_chunk": BLOCK, "kv": {"format": "none", "prefix_cache": {"block": BLOCK,
                                                                                      **prefix_cache}}})


def test_bounds_and_common_prefix() -> None:
    assert chunk_bounds(0, 20, 8) == [(0, 8), (8, 16), (16, 20)]
    assert chunk_bounds(16, 20, 8) == [(16, 20)]
    assert chunk_bounds(6, 30, 8) == [(6, 14), (14, 22), (22, 30)]  # passes count from the first uncached
    assert chunk_bounds(0, 30, 2048, (24,)) == [(0, 24), (24, 30)]  # one pass, split where an entry is copied
    assert chunk_bounds(18, 30, 2048, (24, 24)) == [(18, 24), (24, 30)]
    assert common_prefix((1, 2, 3, 4), [1, 2, 9], 10) == 2
    assert common_prefix((1, 2, 3), [1, 2, 3, 4], 2) == 2


def test_spec_parses_dumps_only_when_set_and_bad_keys_are_one_line_errors() -> None:
    args = parse_args({"kv": {"format": "none", "prefix_cache": {"replay_window": 128}}})
    assert args.kv is not None and args.kv.prefix_cache is not None and args.kv.prefix_cache.replay_window == 128
    assert "prefix_cache" not in KVQuantSpec().model_dump()  # specs without it fingerprint as before
    bad = [({"replay_window": -1}, "replay_window"), ({"replay_windw": 4}, "did you mean 'replay_window'"),
           ({"enabled": False, "replay_window": 4}, "read only when enabled")]
    for table, words in bad:
        with pytest.raises(EngineError, match=words) as info:
            parse_args({"kv": {"format": "none", "prefix_cache": table}})
        assert "\n" not in str(info.value) and "prefix_cache" in str(info.value)


def test_replay_window_larger_than_the_context_is_refused() -> None:
    with pytest.raises(EngineError, match="replay_window 4096 is larger than the model context") as info:
        cached_engine(replay_window=4096)
    assert "\n" not in str(info.value)
    off = tiny_engine({"kv": {"format": "none", "prefix_cache": {"enabled": False}}})
    assert not off.prefix_cache_enabled
    with pytest.raises(EngineError, match="no prefix cache"):
        off.prefix_cache_stats()


def test_hits_are_whole_blocks_counted_per_request_and_in_total() -> None:
    engine = cached_engine()
    assert isinstance(engine, PrefixCacheControl)
    first = engine.generate([GenerateRequest(prompt=PROMPT, max_tokens=4)])[0]
    assert isinstance(first, GenerateResult) and first.cached_tokens == 0
    n1 = first.prompt_tokens
    assert n1 == len(engine.hf.tokens.encode(PROMPT))
    second = engine.generate([GenerateRequest(prompt=PROMPT + MORE, max_tokens=4)])[0]
    assert isinstance(second, GenerateResult)
    shared = common_prefix(tuple(engine.hf.tokens.encode(PROMPT)), engine.hf.tokens.encode(PROMPT + MORE), n1)
    assert second.cached_tokens == shared // BLOCK * BLOCK > 0
    stats = engine.prefix_cache_stats()
    assert (stats.queried_tokens, stats.hit_tokens, stats.source) == (n1 + second.prompt_tokens,
                                                                     second.cached_tokens, "counted")
    assert len(engine.prefix_cache) == 1  # the second prompt's entry replaced the one it extends
    engine.reset_prefix_cache()
    assert len(engine.prefix_cache) == 0
    again = engine.generate([GenerateRequest(prompt=PROMPT + MORE, max_tokens=4)])[0]
    assert isinstance(again, GenerateResult) and again.cached_tokens == 0
    assert engine.prefix_cache_stats().queried_tokens == stats.queried_tokens + again.prompt_tokens


def test_requests_of_one_call_hit_each_other_in_request_order() -> None:
    engine = cached_engine()
    out = engine.generate([GenerateRequest(prompt=PROMPT, max_tokens=3),
                           GenerateRequest(prompt=PROMPT + MORE, max_tokens=3)])
    assert [r.cached_tokens for r in out] == [0, len(engine.hf.tokens.encode(PROMPT)) // BLOCK * BLOCK]


def test_a_replay_on_a_full_attention_model_is_refused() -> None:
    with pytest.raises(EngineError, match="needs a model with sliding-window layers") as info:
        cached_engine(replay_window=BLOCK)
    assert "\n" not in str(info.value)


def test_lru_budget_drops_the_least_recently_used_prompt() -> None:
    engine = cached_engine(max_tokens=3 * BLOCK)
    prompts = ["Once upon a time there was a small town.", "Question: what is 2 + 3? Answer: five!"]
    for p in prompts:
        engine.generate([GenerateRequest(prompt=p, max_tokens=2)])
    assert len(engine.prefix_cache) == 1 and engine.prefix_cache.cached_positions <= 3 * BLOCK
    kept = next(iter(engine.prefix_cache.entries))
    assert list(kept) == engine.hf.tokens.encode(prompts[1])[: len(kept)]


def test_format_none_warm_equals_cold_bit_for_bit_on_the_tiny_model() -> None:
    """A hit reads the cold run's positions, and with passes of one block the positions after it run in
    the cold run's shapes."""
    engine = cached_engine()
    p2 = PROMPT + MORE
    gen = GenerateRequest(prompt=p2, max_tokens=6)
    tf = TokenLogprobsRequest(text=" and the bread", context=p2, top_k=5)
    engine.generate([GenerateRequest(prompt=PROMPT, max_tokens=2)])
    warm, warm_tf = engine.generate([gen])[0], engine.token_logprobs([tf])[0]
    engine.reset_prefix_cache()
    cold = engine.generate([gen])[0]
    engine.reset_prefix_cache()
    cold_tf = engine.token_logprobs([tf])[0]
    assert isinstance(warm, GenerateResult) and isinstance(cold, GenerateResult) and warm.cached_tokens
    assert warm.text == cold.text and warm_tf == cold_tf


def test_nvfp4_hit_reads_the_stored_bytes_unchanged() -> None:
    """An entry is the cache as the prompt's prefill held it at its last whole block (NVFP4 bytes, FP8
    window and dynamic scales), so a hit reads what a cold prefill of those positions stores."""
    engine = tiny_engine({"prefill_chunk": BLOCK, "kv": {"format": "nvfp4", "recent_window": 4,
                                                         "prefix_cache": {"block": BLOCK}}})
    ids = engine.hf.tokens.encode(PROMPT)
    keep = len(ids) // BLOCK * BLOCK
    assert keep < len(ids)  # the entry is cut before the prompt's last chunk
    engine.prefix_cache.serve(ids, len(ids) - 1, len(ids))
    cache, read, _ = engine.prefix_cache.lookup(ids + ids, len(ids) - 1)
    assert read == keep
    engine.reset_prefix_cache()
    cold = engine.prefix_cache.serve(ids[:keep], keep - 1, keep).cache  # a cold prefill of the hit's positions
    for mine, live in zip(cache.layers, cold.layers, strict=True):
        for a, b in ((mine.k, live.k), (mine.v, live.v)):
            (main, recent), (cold_main, cold_recent) = a.stored(), b.stored()
            assert main is not None and cold_main is not None and recent is not None and cold_recent is not None
            assert main.format == "nvfp4" and recent.format == "fp8_e4m3"
            assert all(torch.equal(t, cold_main.data[key]) for key, t in main.data.items())  # NVFP4 bytes
            assert recent.shape[-2] == 4  # the whole FP8 window, as a cold prefill ends with it
            assert torch.equal(recent.data["values"], cold_recent.data["values"])
            assert torch.equal(a.scale, b.scale)  # the served prompt's own dynamic scale
            assert torch.equal(a.view(), b.view())  # the stored values, not recomputed


def gsm8k_turns(data_dir: Path, n: int) -> list[str]:
    """n cumulative multi-turn prompts: a GSM8K few-shot block, then questions each turn extends with."""
    rows = [json.loads(line) for line in (data_dir / "gsm8k" / "train.jsonl").read_text().splitlines()[:n + 2]]
    shots = "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in rows[:2])
    prompts, text = [], shots
    for r in rows[2:]:
        text += f"Question: {r['question']}\nAnswer:"
        prompts.append(text)
        text += f" {r['answer']}\n\n"
    return prompts


@pytest.fixture(scope="module")
def smollm2_cached():  # -> HFEngine with SmolLM2-135M-Instruct and a format-none prefix cache
    from evals.engines import build_engine

    engine = build_engine("hf", smollm2_or_skip(), {"prefill_chunk": 64,
                                                    "kv": {"format": "none", "prefix_cache": {"block": 64}}})
    yield engine
    engine.close()


def test_format_none_warm_equals_cold_bit_for_bit_on_smollm2(smollm2_cached) -> None:
    """Generation (greedy) and the teacher-forced reference after a hit equal the cold ones exactly."""
    engine = smollm2_cached
    prompts = gsm8k_turns(shared_data_dir("gsm8k"), 2)
    refs = [TokenLogprobsRequest(text=" Let us think step by step.", context=p, top_k=5) for p in prompts]
    gens = [GenerateRequest(prompt=p, max_tokens=8, until=("\n\n",)) for p in prompts]
    engine.reset_prefix_cache()
    warm = []
    for g, r in zip(gens, refs, strict=True):
        warm.append((engine.generate([g])[0], engine.token_logprobs([r])[0]))
    cold = []
    for g, r in zip(gens, refs, strict=True):
        engine.reset_prefix_cache()
        res = engine.generate([g])[0]
        engine.reset_prefix_cache()
        cold.append((res, engine.token_logprobs([r])[0]))
    assert isinstance(warm[1][0], GenerateResult) and warm[1][0].cached_tokens > 0  # the second turn hit
    for (wg, wt), (cg, ct) in zip(warm, cold, strict=True):
        assert isinstance(wg, GenerateResult) and isinstance(cg, GenerateResult)
        assert wg.text == cg.text and wt == ct
