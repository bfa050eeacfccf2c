"""quant.fileio: atomic replacement and the one JSON-lines reader, on small explicit files."""

from __future__ import annotations

from pathlib import Path

import pytest

from quant.fileio import atomic_write_text, jsonl_objects


class BadInput(Exception):
    pass


def read(lines: list[str], keys: tuple[str, ...] = ()) -> list[tuple[int, dict]]:
    return list(jsonl_objects(lines, "f.jsonl", BadInput, corrupt="the file is corrupt", expected="not a row",
                              keys=keys))


def test_objects_with_their_line_numbers_blank_lines_skipped() -> None:
    assert read(['{"a": 1}', "", "  ", '{"a": 2, "b": "\u2028"}']) == [(1, {"a": 1}), (4, {"a": 2, "b": "\u2028"})]


def test_a_line_that_is_not_json_is_named() -> None:
    with pytest.raises(BadInput, match=r"^f\.jsonl:2: not valid JSON \(Expecting .*\); the file is corrupt$"):
        read(['{"a": 1}', '{"a": '])


@pytest.mark.parametrize("line", ["[1, 2]", "3", '"text"', '{"b": 1}'])
def test_a_line_that_is_not_an_object_with_the_keys_is_named(line: str) -> None:
    with pytest.raises(BadInput, match=r"^f\.jsonl:1: not a row$"):
        read([line], keys=("a",))


def test_it_reads_a_file_handle_line_by_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    atomic_write_text(path, '{"a": 1}\n\n{"a": 2}\n')
    with open(path, encoding="utf-8") as fh:
        assert [obj["a"] for _, obj in jsonl_objects(fh, path, BadInput, corrupt="", expected="")] == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["rows.jsonl"]  # no temp file left behind
