"""benchmarks/agentic_prefill_speed.py's parts on the tiny model (no timing asserted): prompts of exactly
the asked length from the shared GSM8K text, and one cold prefill per path that leaves what each path
leaves (the prefix-cache path stores the prompt's whole blocks, the engine path stores nothing)."""

from __future__ import annotations

import pytest

from benchmarks import agentic_prefill_speed as aps
from tests.evals.hf_fixtures import tiny_engine
from tests.shared_data import shared_data_dir


def test_prompts_have_the_asked_length_and_extend_each_other() -> None:
    engine = tiny_engine()
    short, long = (aps.prompt_ids(engine.hf.tokens, shared_data_dir("gsm8k"), n) for n in (100, 240))
    assert (len(short), len(long)) == (100, 240) and long[:90] == short[:90]


@pytest.mark.parametrize("path", ["engine", "prefix-cache"])
def test_one_cold_prefill_per_path(path: str) -> None:
    kv = {"format": "nvfp4", "recent_window": 8, "prefix_cache": {"block": aps.BLOCK, "max_tokens": 4096}}
    engine = tiny_engine({"kv": kv, "prefill_chunk": 64})
    ids = aps.prompt_ids(engine.hf.tokens, shared_data_dir("gsm8k"), 200)
    for _ in range(2):  # cold each time: the second prefill finds nothing cached
        wall, cpu = aps.prefill(engine, ids, path)
        assert wall > 0 and cpu > 0
    cached = engine.prefix_cache.entries
    assert [len(k) for k in cached] == ([200 // aps.BLOCK * aps.BLOCK] if path == "prefix-cache" else [])
    assert engine.prefix_cache_stats().hit_tokens == 0
