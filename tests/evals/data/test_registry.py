"""The dataset registry: every split of shared/data/MANIFEST.md is registered, lookups by name
suggest the closest name, and task names map to the files their datasets read."""

from __future__ import annotations

import pytest

from evals import data
from evals.data import registry
from evals.errors import DataError
from tests.shared_data import SHARED_DATA as DATA_DIR

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


def _one_line(exc: pytest.ExceptionInfo[DataError]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_registry_covers_every_manifest_split() -> None:
    assert {(n, s) for n, spec in registry.DATASETS.items() for s in spec.splits} == set(MANIFEST_COUNTS)
    assert {(n, s): p.count for n, spec in registry.DATASETS.items() for s, p in spec.splits.items()} == (
        MANIFEST_COUNTS
    )


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
    assert registry.DATASETS["mmlu"].eval_split == "test"


def test_unknown_dataset_suggests_closest() -> None:
    with pytest.raises(DataError) as exc:
        data.load("gsm8kk", None)
    assert "did you mean 'gsm8k'" in _one_line(exc)
    with pytest.raises(DataError, match="did you mean 'mmlu'"):
        registry.get_spec("mmul")


def test_unknown_split() -> None:
    with pytest.raises(DataError, match="no split 'dev'"):
        data.load("gsm8k", None, "dev")


def test_datasets_name_their_files() -> None:
    assert registry.data_files(["piqa", "gsm8k"]) == [
        "gsm8k/test.jsonl",
        "gsm8k/train.jsonl",
        "piqa/valid-labels.lst",
        "piqa/valid.jsonl",
    ]
    assert len(registry.data_files(["mmlu"])) == 2 * 57
    assert registry.data_files([]) == []
    with pytest.raises(DataError, match="did you mean"):
        registry.data_files(["gsm8k_cot"])
    with pytest.raises(DataError, match="unknown dataset 'gpqa_main_cot_zeroshot'"):
        registry.data_files(["gpqa_main_cot_zeroshot"])  # a task: evals.tasks.task_datasets maps it
