"""Local readers: the llm-foundry conversions map back to the hub fields faithfully, ids are the
datasets' own where they have one, and wrong-shaped files fail with one named line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from evals import data
from evals.errors import DataError
from tests.shared_data import SHARED_DATA as DATA_DIR

needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data")


def _one_line(exc: pytest.ExceptionInfo[DataError]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def _raw_jsonl(rel: str) -> list[dict]:
    return [
        json.loads(line) for line in (DATA_DIR / rel).read_text(encoding="utf-8").splitlines() if line.strip()
    ]


@needs_data
def test_dataset_own_ids() -> None:
    assert data.load("math500", DATA_DIR)[0]["id"] == "test/precalculus/807.json"
    mmlu = data.load("mmlu", DATA_DIR, "dev")
    assert mmlu[0]["id"] == "abstract_algebra/0" and mmlu[5]["id"] == "anatomy/0"


@needs_data
def test_arc_maps_back_to_hub_fields() -> None:
    raw = _raw_jsonl("arc_easy/arc_easy.jsonl")
    rows = data.load("arc_easy", DATA_DIR)
    for r, row in zip(raw, rows, strict=True):
        assert "Question: " + row["question"] == r["query"]
        assert row["choices"]["text"] == r["choices"]
        assert row["choices"]["label"].index(row["answerKey"]) == r["gold"]


@needs_data
def test_boolq_maps_back_to_passage_and_question() -> None:
    raw = _raw_jsonl("boolq/boolq.jsonl")
    rows = data.load("boolq", DATA_DIR)
    for r, row in zip(raw, rows, strict=True):
        assert f"Passage: {row['passage']}\nQuestion: {row['question']}?" == r["query"]
        assert row["label"] == r["gold"]
    assert rows[0]["question"] == "does ethanol take more energy make that produces"


@needs_data
def test_winogrande_rebuilt_sentence_gives_the_original_contexts() -> None:
    raw = _raw_jsonl("winogrande/winogrande.jsonl")
    rows = data.load("winogrande", DATA_DIR)
    for r, row in zip(raw, rows, strict=True):
        idx = row["sentence"].index("_")
        assert [row["sentence"][:idx] + o for o in (row["option1"], row["option2"])] == r["context_options"]
        assert row["sentence"][idx + 1 :].strip() == r["continuation"]
        assert row["answer"] == str(r["gold"] + 1)
    assert (rows[0]["option1"], rows[0]["option2"]) == ("Sarah", "Maria")


@needs_data
def test_lambada_text_splits_back_into_context_and_word() -> None:
    raw = _raw_jsonl("lambada_openai/lambada_openai.jsonl")
    rows = data.load("lambada_openai", DATA_DIR)
    for r, row in zip(raw, rows, strict=True):
        assert " ".join(row["text"].split(" ")[:-1]) == r["context"]
        assert row["text"].split(" ")[-1] == r["continuation"]


@needs_data
def test_piqa_labels_and_truthfulqa_targets() -> None:
    piqa = data.load("piqa", DATA_DIR)
    labels = (DATA_DIR / "piqa/valid-labels.lst").read_text(encoding="utf-8").splitlines()
    assert [r["label"] for r in piqa] == [int(x) for x in labels]
    assert sum(r["label"] for r in piqa) == 928  # ones in valid-labels.lst (counted with a separate script)
    tqa = data.load("truthfulqa_mc", DATA_DIR)
    assert all(r["mc1_targets"]["labels"][0] == 1 and sum(r["mc1_targets"]["labels"]) == 1 for r in tqa)
    assert all(len(r["mc2_targets"]["choices"]) == len(r["mc2_targets"]["labels"]) for r in tqa)


@needs_data
def test_wikitext_rows_are_hub_style_lines() -> None:
    rows = data.load("wikitext2", DATA_DIR)
    assert rows[0]["text"] == "" and rows[1]["text"] == " = Robert Boulter = \n"
    assert all(r["text"] == "" or r["text"].endswith("\n") for r in rows)


@needs_data
def test_mmlu_rows() -> None:
    rows = data.load("mmlu", DATA_DIR)
    assert len({r["subject"] for r in rows}) == 57
    assert all(len(r["choices"]) == 4 and r["answer"] in range(4) for r in rows)


@needs_data
def test_mmlu_csv_with_wrong_columns(tmp_path: Path) -> None:
    shutil.copytree(DATA_DIR / "mmlu", tmp_path / "mmlu")
    path = tmp_path / "mmlu/dev/anatomy_dev.csv"
    os.chmod(path, 0o644)
    path.write_text("question,a,b\nq,1,2\n", encoding="utf-8")
    with pytest.raises(DataError) as exc:
        data.load("mmlu", tmp_path, "dev")
    assert "anatomy_dev.csv: expected CSV columns" in _one_line(exc)


@needs_data
def test_piqa_label_count_mismatch(tmp_path: Path) -> None:
    (tmp_path / "piqa").mkdir()
    shutil.copy(DATA_DIR / "piqa/valid.jsonl", tmp_path / "piqa/valid.jsonl")
    (tmp_path / "piqa/valid-labels.lst").write_text("0\n1\n", encoding="utf-8")
    with pytest.raises(DataError) as exc:
        data.load("piqa", tmp_path)
    assert "2 labels for 1838 rows" in _one_line(exc)


def test_arc_row_of_the_wrong_shape_is_named(tmp_path: Path) -> None:
    (tmp_path / "arc_easy").mkdir()
    row = {"query": "Q: no prefix", "choices": ["a", "b", "c", "d"], "gold": 0}
    (tmp_path / "arc_easy/arc_easy.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as exc:
        data.load("arc_easy", tmp_path)
    assert "arc_easy.jsonl:1: expected query 'Question: ...'" in _one_line(exc)
