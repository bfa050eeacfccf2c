"""The sessions probe served cold, warm and shuffled on the real hf engine (SmolLM2-135M) with its prefix
cache: counted hits on the warm path only, warm == cold exactly with format none and no replay, the
record format, resume, and the one-line refusals."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evals.engines import build_engine
from evals.errors import EngineError, EvalError
from evals.records.samples import SampleRecord, read_records
from evals.run.runner import run_task
from evals.run.sessions import run_sessions
from evals.tasks import get_task
from evals.tasks.base import TaskOptions
from evals.tasks.sessions import SessionsTask
from tests.evals.hf_fixtures import smollm2_or_skip, tiny_engine
from tests.shared_data import shared_data_dir

OPTIONS = {"context_tokens": 128, "turns": 2, "sessions": 2, "asks": "lookup", "shuffle_batch": 3}


def sessions(max_tokens: int = 4, **extra: Any) -> SessionsTask:
    task = get_task("sessions", TaskOptions(max_tokens=max_tokens, extra={**OPTIONS, **extra}))
    assert isinstance(task, SessionsTask)
    return task


@pytest.fixture(scope="module")
def data() -> Path:
    return shared_data_dir("gsm8k/test.jsonl")


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    built = build_engine("hf", smollm2_or_skip(), {"kv": {"format": "none", "prefix_cache": {"enabled": True}}})
    yield built
    built.close()


@pytest.fixture(scope="module")
def records(engine: Any, data: Path, tmp_path_factory: pytest.TempPathFactory) -> list[SampleRecord]:
    out = tmp_path_factory.mktemp("sessions") / "sessions.jsonl"
    summary = run_task(engine, sessions(), arm="baseline", out_path=out, data_dir=data, progress=False)
    assert summary.written == summary.samples == 2 * 2 * 3 and summary.errors == 0
    return read_records(out)


def by_path(records: list[SampleRecord], path: str) -> dict[str, SampleRecord]:
    return {r.item_id.rsplit("/", 1)[0]: r for r in records if r.meta["cache_path"] == path}


def test_record_format(records: list[SampleRecord]) -> None:
    assert [r.item_id for r in records[:4]] == ["s000/t1/cold", "s000/t2/cold", "s000/t1/warm", "s000/t2/warm"]
    for r in records:
        session, turn, path = r.item_id.split("/")
        assert r.cluster == session == r.meta["session"] and turn == f"t{r.meta['turn']}"
        assert path == r.meta["cache_path"] and r.meta["ask"] == "lookup"
        assert r.meta["hit_source"] == "counted" and r.reference_logprobs is not None
        assert set(r.scores) == {"exact_match,strict-match", "exact_match,flexible-extract"}
        assert isinstance(r.meta["prompt_tokens"], int) and r.meta["prompt_tokens"] > 100


def test_hits_are_counted_on_the_warm_path_only(records: list[SampleRecord]) -> None:
    cold, warm = by_path(records, "cold"), by_path(records, "warm")
    assert all(r.meta["cached_tokens"] == 0 and r.meta["counter_hit_tokens"] == 0 for r in cold.values())
    assert all(r.meta["reference_hit_tokens"] == 0 for r in cold.values())
    for key, r in warm.items():  # turn 1 reads the served context, turn 2 turn 1's prompt and answer
        assert r.meta["cached_tokens"] == r.meta["counter_hit_tokens"] > 0
        assert r.meta["counter_queried_tokens"] == r.meta["prompt_tokens"] == cold[key].meta["prompt_tokens"]
        assert r.meta["reference_hit_tokens"] > 0  # the teacher-forced pass reads the generation's prompt
        assert r.meta["path_hit_tokens"] > 0
    t1, t2 = warm["s000/t1"], warm["s000/t2"]
    assert t2.meta["cached_tokens"] > t1.meta["cached_tokens"]


def test_format_none_without_replay_warm_equals_cold_exactly(records: list[SampleRecord]) -> None:
    cold, warm = by_path(records, "cold"), by_path(records, "warm")
    assert cold.keys() == warm.keys()
    for key in cold:
        assert warm[key].completion == cold[key].completion
        assert warm[key].prompt_hash == cold[key].prompt_hash
        assert warm[key].reference_logprobs == cold[key].reference_logprobs  # every float equal


def test_shuffled_pass_serves_the_cold_prompts_in_batches(records: list[SampleRecord]) -> None:
    shuffled, cold = by_path(records, "shuffled"), by_path(records, "cold")
    assert shuffled.keys() == cold.keys()
    assert all(r.meta["shuffle"] == 1 and r.prompt_hash == cold[k].prompt_hash for k, r in shuffled.items())


def test_resume_rewrites_a_partial_session_whole_and_writes_only_what_is_missing(
        engine: Any, data: Path, records: list[SampleRecord], tmp_path: Path) -> None:
    out = tmp_path / "sessions.jsonl"
    keep = [r for r in records if r.item_id not in ("s001/t2/warm", "s000/t2/shuffled")]
    out.write_text("".join(r.model_dump_json() + "\n" for r in keep), encoding="utf-8")
    summary = run_sessions(engine, sessions(), arm="baseline", out_path=out, data_dir=data)
    assert (summary.skipped, summary.written) == (len(keep), 2)
    again = {r.item_id: r for r in read_records(out)}
    first = {r.item_id: r for r in records}
    assert again.keys() == first.keys()
    assert again["s001/t2/warm"].completion == first["s001/t2/warm"].completion
    assert again["s001/t2/warm"].meta["cached_tokens"] == first["s001/t2/warm"].meta["cached_tokens"]


def test_records_of_other_options_are_refused(engine: Any, data: Path, records: list[SampleRecord],
                                              tmp_path: Path) -> None:
    out = tmp_path / "sessions.jsonl"
    out.write_text("".join(r.model_dump_json() + "\n" for r in records), encoding="utf-8")
    with pytest.raises(EvalError, match="different prompt"):
        run_sessions(engine, sessions(seed=1), arm="baseline", out_path=out, data_dir=data)


def test_an_engine_without_a_prefix_cache_is_refused_naming_what_to_set(data: Path, tmp_path: Path) -> None:
    plain = tiny_engine({"kv": {"format": "none"}})
    with pytest.raises(EngineError, match=r"set engine_args\.kv\.prefix_cache = \{ enabled = true \}") as err:
        run_sessions(plain, sessions(), arm="a", out_path=tmp_path / "s.jsonl", data_dir=data)
    assert "\n" not in str(err.value) and not (tmp_path / "s.jsonl").exists()


def test_sizes_that_do_not_fit_are_one_line_errors(engine: Any, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    with pytest.raises(EvalError, match="the model's window is 8192: lower context_tokens") as err:
        run_sessions(engine, sessions(context_tokens=9000), arm="a", out_path=out, data_dir=data)
    assert "\n" not in str(err.value)
    with pytest.raises(EvalError, match="limit 3 would cut sessions apart"):
        run_sessions(engine, sessions(), arm="a", out_path=out, data_dir=data, limit=3)
    with pytest.raises(EvalError, match="repeats = 2"):
        run_sessions(engine, sessions(), arm="a", out_path=out, data_dir=data, repeats=2)
    assert not out.exists()


# The agentic task on the same runner: a tiny engine (its window widened) for the plumbing, SmolLM2 for one
# short real session.
AGENTIC = {"sessions": 1, "turns": 4, "cycle": ["tool", "lookup"], "functions": 3, "context_tokens": 512,
           "session_tokens": 700}


def agentic(max_tokens: int = 4, **extra: Any) -> Any:
    return get_task("agentic", TaskOptions(max_tokens=max_tokens, extra={**AGENTIC, **extra}))


def test_agentic_records_carry_turn_meta_and_warm_equals_cold_on_format_none(data: Path, tmp_path: Path) -> None:
    # passes of one block (prefill_chunk = block): warm and cold run the same forward shapes, so format none
    # gives warm == cold bit for bit (with the default 2048-token passes they differ by float rounding)
    eng = tiny_engine({"max_length": 16384, "prefill_chunk": 64,
                       "kv": {"format": "none", "prefix_cache": {"enabled": True, "block": 64}}})
    out = tmp_path / "agentic.jsonl"
    summary = run_task(eng, agentic(), arm="baseline", out_path=out, data_dir=data, progress=False)
    assert summary.written == 4 * 2 and summary.errors == 0
    recs = read_records(out)
    assert [r.item_id for r in recs[:2]] == ["s000/t1/cold", "s000/t2/cold"]
    cold, warm = by_path(recs, "cold"), by_path(recs, "warm")
    for key, r in cold.items():
        assert r.meta["kind"] == ("tool" if r.meta["turn"] % 2 else "lookup") and r.task == "agentic"
        assert isinstance(r.meta["prompt_tokens"], int) and isinstance(r.meta["prompt_chars"], int)
        if r.meta["kind"] == "tool":
            assert isinstance(r.meta["tool_parsed"], bool) and r.meta["tool_error"] is not None
        assert warm[key].completion == r.completion and warm[key].reference_logprobs == r.reference_logprobs
        assert r.meta["cached_tokens"] == 0 and warm[key].meta["cached_tokens"] > 0
    tokens = [cold[f"s000/t{k}"].meta["prompt_tokens"] for k in range(1, 5)]
    assert tokens == sorted(tokens) and tokens[0] < tokens[-1]


def test_agentic_cold_only_needs_no_prefix_cache_and_the_warm_path_does(data: Path, tmp_path: Path) -> None:
    plain = tiny_engine({"max_length": 16384, "kv": {"format": "none"}})
    out = tmp_path / "cold.jsonl"
    summary = run_sessions(plain, agentic(paths=["cold"]), arm="a", out_path=out, data_dir=data)
    assert summary.written == 4 and {r.meta["cache_path"] for r in read_records(out)} == {"cold"}
    assert all(r.meta["counter_hit_tokens"] is None for r in read_records(out))  # no counters: said, not 0
    with pytest.raises(EngineError, match="agentic: the hf engine has no prefix cache to serve the warm path"):
        run_sessions(plain, agentic(), arm="a", out_path=tmp_path / "w.jsonl", data_dir=data)


def test_agentic_sessions_beyond_the_window_are_refused_naming_session_tokens(engine: Any, data: Path,
                                                                              tmp_path: Path) -> None:
    with pytest.raises(EvalError, match="the model's window is 8192: lower session_tokens") as err:
        run_sessions(engine, agentic(session_tokens=9000, turns=2), arm="a", out_path=tmp_path / "x.jsonl",
                     data_dir=data)
    assert "\n" not in str(err.value)


def test_a_short_real_agentic_session_on_smollm2(engine: Any, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "real.jsonl"
    task = agentic(max_tokens=32, turns=2, session_tokens=800)
    summary = run_sessions(engine, task, arm="baseline", out_path=out, data_dir=data)
    assert summary.written == 4 and summary.errors == 0
    recs = read_records(out)
    cold, warm = by_path(recs, "cold"), by_path(recs, "warm")
    for key, r in cold.items():
        assert warm[key].completion == r.completion  # format none, no replay: warm == cold bit for bit
        assert warm[key].meta["cached_tokens"] > 0 and r.meta["cached_tokens"] == 0
        assert r.reference_logprobs is not None and len(r.reference_logprobs.target_ids) > 3
        if r.meta["kind"] == "tool":  # the real output, scored as BFCL's checker scores it (test_tool_calls)
            assert r.meta["function"] in (r.target or "") and set(r.scores) == {
                "exact_match,strict-match", "exact_match,flexible-extract"}
            assert r.meta["tool_correct"] == (r.scores["exact_match,strict-match"] == 1.0)
