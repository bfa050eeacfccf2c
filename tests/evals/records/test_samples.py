"""SampleRecord round trip, the crash-safe writer and the torn-line reader; non-finite scores are
errored samples when made and one-line errors when read."""

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from evals.engines.base import EngineInfo, Failure, GenerateRequest, GenerateResult
from evals.errors import RecordError
from evals.records.samples import (
    RecordWriter,
    SampleRecord,
    first_non_finite,
    read_records,
    sha256_text,
)
from evals.run.runner import run_task
from evals.tasks.base import Item, Request, Result, Scored, TaskKind


def rec(item: str, repeat: int = 0, score: float | None = 1.0) -> SampleRecord:
    return SampleRecord(task="t", task_version="1", arm="baseline", item_id=item, repeat=repeat,
                        prompt_hash=sha256_text(item), scores={"acc,none": score})


def test_sha256_matches_known_value():
    assert sha256_text("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_writer_appends_and_resumes_without_duplicates(tmp_path):
    path = tmp_path / "r" / "t.jsonl"
    with RecordWriter(path) as w:
        w.write(rec("a"))
        w.write(rec("b"))
    with RecordWriter(path) as w:
        assert w.done == {("a", 0), ("b", 0)}
        with pytest.raises(RecordError, match="duplicate"):
            w.write(rec("a"))
        w.write(rec("c"))
    assert [r.item_id for r in read_records(path)] == ["a", "b", "c"]


def test_torn_last_line_is_dropped_with_warning_and_repaired(tmp_path, caplog):
    path = tmp_path / "t.jsonl"
    good = rec("a").model_dump_json() + "\n"
    torn = rec("b").model_dump_json()[:37]
    path.write_text(good + torn)
    with caplog.at_level(logging.WARNING):
        assert [r.item_id for r in read_records(path)] == ["a"]
    assert "torn" in caplog.text
    with RecordWriter(path) as w:  # repairs, then appends cleanly
        w.write(rec("b"))
    assert path.read_text() == good + rec("b").model_dump_json() + "\n"


def test_only_a_torn_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"schema_vers')
    assert read_records(path, repair=True) == []
    assert path.read_text() == ""


def test_corrupt_middle_line_is_an_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(rec("a").model_dump_json() + "\n" + "garbage\n" + rec("b").model_dump_json() + "\n")
    with pytest.raises(RecordError, match=r"t.jsonl:2: not valid JSON"):
        read_records(path)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("schema_version", 99, "schema_version 99"), ("surprise", 1, "surprise")],
    ids=["other-schema-version", "unknown-field"],
)
def test_a_changed_record_is_refused(tmp_path, field, value, message):
    path = tmp_path / "t.jsonl"
    data = json.loads(rec("a").model_dump_json())
    data[field] = value
    path.write_text(json.dumps(data) + "\n")
    with pytest.raises(RecordError, match=message):
        read_records(path)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_reader_never_crashes_with_anything_but_record_error(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("fuzz") / "t.jsonl"
    path.write_bytes(blob)
    try:
        out = read_records(path)
    except RecordError:
        return
    assert all(isinstance(r, SampleRecord) for r in out)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=8), st.integers(0, 3),
                          st.one_of(st.none(), st.floats(0, 1))), max_size=10, unique_by=lambda t: t[:2]))
def test_round_trip(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("rt") / "t.jsonl"
    with RecordWriter(path) as w:
        for item, repeat, score in rows:
            w.write(rec(item, repeat, score))
    assert read_records(path) == [rec(i, r, s) for i, r, s in rows]


# ----------------------------------------------------------------------------- non-finite scores


@pytest.mark.parametrize(("literal", "shown"), [("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf")])
def test_a_records_file_with_a_non_finite_score_is_a_one_line_error(tmp_path, literal, shown):
    """The review's repro: a native record with score NaN / Infinity (json.dumps writes these literals)."""
    path = tmp_path / "t.jsonl"
    good = rec("a").model_dump_json()
    bad = good.replace('"scores":{"acc,none":1.0}', f'"scores":{{"acc,none":{literal}}}').replace('"a"', '"b"', 1)
    assert literal in bad
    path.write_text(good + "\n" + bad + "\n")
    with pytest.raises(RecordError) as exc:
        read_records(path)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{path}:2: invalid record")
    assert f"non-finite score {shown} for 'acc,none'" in msg


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_record_cannot_hold_a_non_finite_score(value):
    with pytest.raises(ValidationError, match="non-finite score"):
        rec("a", score=value)
    assert rec("a", score=None).scores == {"acc,none": None}  # None (no score) is fine


def test_first_non_finite_names_the_first_bad_score():
    assert first_non_finite({"acc,none": 1.0, "x,none": None}) is None
    assert first_non_finite({"a": 0.5, "b": float("nan"), "c": float("inf")}) == "non-finite score nan for 'b'"


@dataclass(frozen=True)
class NaNTask:
    """Four items scoring 1.0, NaN, inf and 0.0 (the doc holds the score as text)."""

    name: str = "nan_task"
    version: str = "1"
    kind: TaskKind = "generate"

    def items(self, data_dir: Path | None) -> list[Item]:
        return [Item(item_id=str(i), doc={"score": v}) for i, v in enumerate(("1.0", "nan", "inf", "0.0"))]

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        return GenerateRequest(prompt=f"item {item.item_id}", max_tokens=1)

    def prompt_text(self, request: Request) -> str:
        assert isinstance(request, GenerateRequest)
        return request.prompt

    def score(self, item: Item, result: Result) -> Scored:
        return Scored(scores={"acc,none": float(item.doc["score"])}, extracted={"none": "x"}, target="t")


class OneTokenEngine:
    info = EngineInfo(name="fake", model="fake", deterministic=True)

    def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult | Failure]:
        return [GenerateResult(text="x", output_tokens=1, finish_reason="stop") for _ in requests]


def test_the_runner_records_a_non_finite_score_as_an_errored_sample(tmp_path, caplog):
    path = tmp_path / "records" / "a" / "nan_task.jsonl"
    with caplog.at_level(logging.WARNING):
        summary = run_task(OneTokenEngine(), NaNTask(), arm="a", out_path=path, progress=False)  # type: ignore[arg-type]
    assert (summary.written, summary.errors) == (4, 2)
    recs = {r.item_id: r for r in read_records(path)}  # the file reads back: nothing non-finite in it
    assert recs["0"].scores == {"acc,none": 1.0} and recs["0"].error is None
    assert recs["3"].scores == {"acc,none": 0.0}
    for item, shown in (("1", "nan"), ("2", "inf")):
        assert recs[item].scores == {} and recs[item].extracted == {}
        assert recs[item].error is not None and f"non-finite score {shown} for 'acc,none'" in recs[item].error
        assert recs[item].completion == "x"  # what the engine said is kept
    assert "a/nan_task item '1' repeat 0: non-finite score nan" in caplog.text
