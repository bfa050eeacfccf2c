"""The dataset registry: every dataset by name (a literal dict), its splits, files, item counts
and hub source, with a did-you-mean error for unknown names.

Every dataset is returned as rows in the field layout of its canonical hub dataset (the layout
lm-eval's prompts read: `question`/`answer` for GSM8K, `choices`/`answerKey` for ARC, ...), plus a
stable string `id`: the dataset's own id where both sources carry one (GPQA `Record ID`, MATH-500
`unique_id`), else the row's index in the split (`subject/index` for MMLU), so that an item has the
same id whichever source it came from.
"""

from __future__ import annotations

from collections.abc import Iterable

from evals.data import readers
from evals.data.gpqa import gpqa_reader
from evals.data.spec import DatasetSpec, HubSource, Reader, Split
from evals.errors import DataError
from quant.validation import did_you_mean

# The 57 MMLU subjects (hendrycks/test), one test and one dev CSV each, in file-name order.
MMLU_SUBJECTS: tuple[str, ...] = (
    "abstract_algebra",
    "anatomy",
    "astronomy",
    "business_ethics",
    "clinical_knowledge",
    "college_biology",
    "college_chemistry",
    "college_computer_science",
    "college_mathematics",
    "college_medicine",
    "college_physics",
    "computer_security",
    "conceptual_physics",
    "econometrics",
    "electrical_engineering",
    "elementary_mathematics",
    "formal_logic",
    "global_facts",
    "high_school_biology",
    "high_school_chemistry",
    "high_school_computer_science",
    "high_school_european_history",
    "high_school_geography",
    "high_school_government_and_politics",
    "high_school_macroeconomics",
    "high_school_mathematics",
    "high_school_microeconomics",
    "high_school_physics",
    "high_school_psychology",
    "high_school_statistics",
    "high_school_us_history",
    "high_school_world_history",
    "human_aging",
    "human_sexuality",
    "international_law",
    "jurisprudence",
    "logical_fallacies",
    "machine_learning",
    "management",
    "marketing",
    "medical_genetics",
    "miscellaneous",
    "moral_disputes",
    "moral_scenarios",
    "nutrition",
    "philosophy",
    "prehistory",
    "professional_accounting",
    "professional_law",
    "professional_medicine",
    "professional_psychology",
    "public_relations",
    "security_studies",
    "sociology",
    "us_foreign_policy",
    "virology",
    "world_religions",
)


def _mmlu_files(split: str) -> tuple[str, ...]:
    """One CSV per subject of an MMLU split, in subject order."""
    return tuple(f"mmlu/{split}/{s}_{split}.csv" for s in MMLU_SUBJECTS)


def _gpqa(subset: str, count: int) -> DatasetSpec:
    """One GPQA subset: a member of the shared dataset.zip."""
    return DatasetSpec(
        name=f"gpqa_{subset}",
        splits={"train": Split(("gpqa/dataset.zip",), count, gpqa_reader(subset))},
        hub=HubSource("Idavidrein/gpqa", f"gpqa_{subset}", {"train": "train"}, id_field="Record ID"),
    )


def _foundry(name: str, path: str, count: int, read: Reader, hub: HubSource) -> DatasetSpec:
    """A single-file, single-split dataset; the split is named after the hub source's only split."""
    return DatasetSpec(name=name, splits={next(iter(hub.splits)): Split((path,), count, read)}, hub=hub)


# Counts are those of shared/data/MANIFEST.md (they match the canonical splits).
DATASETS: dict[str, DatasetSpec] = {
    "gsm8k": DatasetSpec(
        name="gsm8k",
        splits={
            "test": Split(("gsm8k/test.jsonl",), 1319, readers.read_gsm8k),
            "train": Split(("gsm8k/train.jsonl",), 7473, readers.read_gsm8k),
        },
        hub=HubSource("openai/gsm8k", "main", {"test": "test", "train": "train"}),
    ),
    "gpqa_diamond": _gpqa("diamond", 198),
    "gpqa_main": _gpqa("main", 448),
    "gpqa_extended": _gpqa("extended", 546),
    "mmlu": DatasetSpec(
        name="mmlu",
        splits={
            "test": Split(_mmlu_files("test"), 14042, readers.read_mmlu),
            "dev": Split(_mmlu_files("dev"), 285, readers.read_mmlu),
        },
        hub=HubSource("cais/mmlu", "all", {"test": "test", "dev": "dev"}),
    ),
    "arc_challenge": _foundry(
        "arc_challenge",
        "arc_challenge/arc_challenge.jsonl",
        1172,
        readers.read_arc,
        HubSource("allenai/ai2_arc", "ARC-Challenge", {"test": "test"}),
    ),
    "arc_easy": _foundry(
        "arc_easy",
        "arc_easy/arc_easy.jsonl",
        2376,
        readers.read_arc,
        HubSource("allenai/ai2_arc", "ARC-Easy", {"test": "test"}),
    ),
    "piqa": DatasetSpec(
        name="piqa",
        splits={"validation": Split(("piqa/valid.jsonl", "piqa/valid-labels.lst"), 1838, readers.read_piqa)},
        hub=HubSource("baber/piqa", None, {"validation": "validation"}),
    ),
    "boolq": _foundry(
        "boolq",
        "boolq/boolq.jsonl",
        3270,
        readers.read_boolq,
        HubSource("aps/super_glue", "boolq", {"validation": "validation"}),
    ),
    "winogrande": _foundry(
        "winogrande",
        "winogrande/winogrande.jsonl",
        1267,
        readers.read_winogrande,
        HubSource("allenai/winogrande", "winogrande_xl", {"validation": "validation"}),
    ),
    "lambada_openai": _foundry(
        "lambada_openai",
        "lambada_openai/lambada_openai.jsonl",
        5153,
        readers.read_lambada,
        HubSource("EleutherAI/lambada_openai", "default", {"test": "test"}),
    ),
    "truthfulqa_mc": _foundry(
        "truthfulqa_mc",
        "truthfulqa/data/v1/mc_task.json",
        817,
        readers.read_truthfulqa_mc,
        HubSource("truthfulqa/truthful_qa", "multiple_choice", {"validation": "validation"}),
    ),
    "math500": _foundry(
        "math500",
        "math500/test.jsonl",
        500,
        readers.read_math500,
        HubSource("HuggingFaceH4/MATH-500", "default", {"test": "test"}, id_field="unique_id"),
    ),
    "wikitext2": _foundry(
        "wikitext2",
        "wikitext2/derived/wiki.test.raw",
        4358,
        readers.read_wikitext,
        HubSource("Salesforce/wikitext", "wikitext-2-raw-v1", {"test": "test"}),
    ),
}

DATA_NOTES: dict[str, str] = {
    "arc_challenge": "local llm-foundry copy: no ARC ids or answer labels; labels are A-D, ids are row indices",
    "arc_easy": "local llm-foundry copy: no ARC ids or answer labels; labels are A-D, ids are row indices",
    "boolq": "local llm-foundry copy: the passage title is dropped (super_glue passages start '<title> -- ')",
    "winogrande": "local llm-foundry copy: sentence rebuilt from the two contexts (exact for lm-eval's prompts)",
    "lambada_openai": "local llm-foundry copy: text = context + ' ' + last word",
    "truthfulqa_mc": "TruthfulQA v1 (817 questions, Oct 2021) in mc_task.json order",
}


def get_spec(name: str) -> DatasetSpec:
    """The registry entry for `name`; unknown names raise DataError with a did-you-mean."""
    try:
        return DATASETS[name]
    except KeyError:
        raise DataError(f"unknown dataset {name!r}; {did_you_mean(name, DATASETS, listing='known')}") from None


def data_files(names: Iterable[str]) -> list[str]:
    """Relative paths of every local file the named datasets read, without duplicates, sorted (a task's
    datasets: evals.tasks.task_datasets); an unknown name raises DataError with a did-you-mean."""
    return sorted({f for n in names for part in get_spec(n).splits.values() for f in part.files})
