"""SampleRecord round trip, the crash-safe writer and the torn-line reader."""

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evals.errors import RecordError
from evals.records import RecordWriter, SampleRecord, read_records, sha256_text


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


def test_other_schema_version_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    data = json.loads(rec("a").model_dump_json())
    data["schema_version"] = 99
    path.write_text(json.dumps(data) + "\n")
    with pytest.raises(RecordError, match="schema_version 99"):
        read_records(path)


def test_unknown_field_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    data = json.loads(rec("a").model_dump_json())
    data["surprise"] = 1
    path.write_text(json.dumps(data) + "\n")
    with pytest.raises(RecordError, match="surprise"):
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
