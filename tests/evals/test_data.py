"""The data layer: every dataset loads from ../shared/data with MANIFEST.md's counts, local
conversions map back to the hub fields faithfully, and bad inputs fail with one named line.
GPQA question text is never printed or asserted on."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from evals import data
from evals.errors import DataError

DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data")

# Item counts from shared/data/MANIFEST.md (written out, not read from the registry under test).
MANIFEST_COUNTS = {
    ("gsm8k", "test"): 1319,
    ("gsm8k", "train"): 7473,
    ("gpqa_diamond", "train"): 198,
    ("gpqa_main", "train"): 448,
    ("gpqa_extended", "train"): 546,
    ("mmlu", "test"): 14042,
    ("mmlu", "dev"): 285,
    ("arc_challenge", "test"): 1172,
    ("arc_easy", "test"): 2376,
    ("piqa", "validation"): 1838,
    ("boolq", "validation"): 3270,
    ("winogrande", "validation"): 1267,
    ("lambada_openai", "test"): 5153,
    ("truthfulqa_mc", "validation"): 817,
    ("math500", "test"): 500,
    ("wikitext2", "test"): 4358,
}


def test_registry_covers_every_manifest_split() -> None:
    assert {(n, s) for n, spec in data.DATASETS.items() for s in spec.splits} == set(MANIFEST_COUNTS)


@needs_data
@pytest.mark.parametrize(("name", "split"), sorted(MANIFEST_COUNTS))
def test_every_dataset_loads_with_manifest_count(name: str, split: str) -> None:
    rows = data.load(name, DATA_DIR, split)
    assert len(rows) == MANIFEST_COUNTS[(name, split)]
    ids = [r["id"] for r in rows]
    assert all(isinstance(i, str) and i for i in ids)
    assert len(set(ids)) == len(ids)  # stable ids are unique within a split


@needs_data
def test_eval_split_is_the_first() -> None:
    assert data.load("gsm8k", DATA_DIR) == data.load("gsm8k", DATA_DIR, "test")
    assert data.DATASETS["mmlu"].eval_split == "test"


@needs_data
def test_dataset_own_ids() -> None:
    assert data.load("math500", DATA_DIR)[0]["id"] == "test/precalculus/807.json"
    gpqa = data.load("gpqa_diamond", DATA_DIR)
    assert all(r["id"] == r["Record ID"] and r["id"].startswith("rec") for r in gpqa)
    mmlu = data.load("mmlu", DATA_DIR, "dev")
    assert mmlu[0]["id"] == "abstract_algebra/0" and mmlu[5]["id"] == "anatomy/0"


def _raw_jsonl(rel: str) -> list[dict]:
    return [
        json.loads(line) for line in (DATA_DIR / rel).read_text(encoding="utf-8").splitlines() if line.strip()
    ]


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
def test_file_hashes_match_manifest_json() -> None:
    manifest = json.loads((DATA_DIR / "manifest.json").read_text(encoding="utf-8"))
    expected = {f["file"]: f["sha256"] for ds in manifest["datasets"] for f in ds.get("files", [])}
    hashes = data.data_file_hashes(["gsm8k", "piqa", "gpqa_main"], DATA_DIR)
    assert set(hashes) == {
        "gsm8k/test.jsonl",
        "gsm8k/train.jsonl",
        "piqa/valid.jsonl",
        "piqa/valid-labels.lst",
        "gpqa/dataset.zip",
    }
    assert all(hashes[k] == expected[k] for k in hashes)
    assert data.data_file_hashes(["gsm8k"], None) == {}
    # task names map to their datasets (the pipeline passes task names)
    by_task = data.data_file_hashes(
        ["gpqa_main_cot_zeroshot", "truthfulqa_mc2", "gpqa_main_zeroshot"], DATA_DIR
    )
    assert set(by_task) == {"gpqa/dataset.zip", "truthfulqa/data/v1/mc_task.json"}
    with pytest.raises(DataError, match="did you mean"):
        data.data_file_hashes(["gsm8k_cot"], DATA_DIR)


# ----------------------------------------------------------------------------- errors


def _one_line(exc: pytest.ExceptionInfo[DataError]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_unknown_dataset_suggests_closest() -> None:
    with pytest.raises(DataError) as exc:
        data.load("gsm8kk", None)
    assert "did you mean 'gsm8k'" in _one_line(exc)


def test_unknown_split() -> None:
    with pytest.raises(DataError, match="no split 'dev'"):
        data.load("gsm8k", None, "dev")


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        data.load("math500", tmp_path)
    msg = _one_line(exc)
    assert str(tmp_path / "math500" / "test.jsonl") in msg and "missing" in msg


@needs_data
def test_truncated_jsonl(tmp_path: Path) -> None:
    (tmp_path / "math500").mkdir()
    lines = (DATA_DIR / "math500/test.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "math500/test.jsonl").write_text("".join(lines[:100]), encoding="utf-8")
    with pytest.raises(DataError) as exc:
        data.load("math500", tmp_path)
    assert "100 items, expected 500" in _one_line(exc)
    (tmp_path / "math500/test.jsonl").write_text("".join(lines[:100]) + lines[100][:40], encoding="utf-8")
    with pytest.raises(DataError) as exc:
        data.load("math500", tmp_path)
    assert "test.jsonl:101: not valid JSON" in _one_line(exc)


def test_wrong_shape_jsonl(tmp_path: Path) -> None:
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k/test.jsonl").write_text('{"question": "q", "solution": "s"}\n', encoding="utf-8")
    with pytest.raises(DataError) as exc:
        data.load("gsm8k", tmp_path)
    assert "test.jsonl:1: expected a JSON object with keys question, answer" in _one_line(exc)


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


@needs_data
def test_gpqa_wrong_password_is_one_line_and_reveals_nothing() -> None:
    with pytest.raises(DataError) as exc:
        data.read_gpqa(DATA_DIR / "gpqa/dataset.zip", "diamond", password=b"not-the-password")
    msg = _one_line(exc)
    assert "dataset.zip:dataset/gpqa_diamond.csv" in msg and ("password" in msg or "decrypt" in msg)
    assert len(msg) < 300


def test_gpqa_not_a_zip(tmp_path: Path) -> None:
    (tmp_path / "gpqa").mkdir()
    (tmp_path / "gpqa/dataset.zip").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataError) as exc:
        data.load("gpqa_diamond", tmp_path)
    assert "dataset.zip" in _one_line(exc)


def test_resolve_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    assert data.resolve_data_dir(None) is None
    assert data.resolve_data_dir(str(tmp_path)) == tmp_path
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    assert data.resolve_data_dir(None) == tmp_path
    with pytest.raises(DataError, match="not a folder"):
        data.resolve_data_dir(tmp_path / "nope")


def test_hub_fallback_is_offline_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    assert data.hub_offline()
    with pytest.raises(DataError) as exc:
        data.load("math500", None)
    msg = _one_line(exc)
    assert "HuggingFaceH4/MATH-500" in msg and "--data-dir" in msg and "HF_DATASETS_OFFLINE=0" in msg
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    assert not data.hub_offline()
