"""Datasets by name: read from a local folder laid out like `shared/data`, else from the hub.

Every dataset is returned as rows in the field layout of its canonical hub dataset (the layout
lm-eval's prompts read: `question`/`answer` for GSM8K, `choices`/`answerKey` for ARC, ...), plus a
stable string `id`: the dataset's own id where both sources carry one (GPQA `Record ID`, MATH-500
`unique_id`), else the row's index in the split (`subject/index` for MMLU), so that an item has the
same id whichever source it came from. Local files that are conversions (llm-foundry's ICL jsonl
for ARC, BoolQ, WinoGrande, LAMBADA) are mapped back to the hub fields; `DATA_NOTES` says how.

GPQA is read from the authors' password-protected `dataset.zip` and decrypted in memory only; its
question text is never printed, logged or written (errors name the file and the Record ID at most).
Missing, truncated or wrong-shaped files raise `DataError` with one line naming the file and what
was expected. Hub loading (no data dir given) uses `datasets.load_dataset` with the canonical ids
and is offline unless HF_DATASETS_OFFLINE=0.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.errors import DataError
from quant.fileio import sha256_file
from quant.validation import did_you_mean

Row = dict[str, Any]

DATA_DIR_ENV = "QA_DATA_DIR"

# The password the GPQA authors publish for dataset.zip (idavidrein/gpqa README, quoted in
# shared/data/MANIFEST.md). It keeps the questions out of web crawls, not a secret.
GPQA_ZIP_PASSWORD = b"deserted-untie-orchid"

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


@dataclass(frozen=True)
class HubSource:
    """Where the hub copy lives: `datasets.load_dataset(path, name, split=...)`."""

    path: str
    name: str | None
    splits: Mapping[str, str]  # our split -> hub split
    id_field: str | None = None  # None: the row index (MMLU: subject/index)


@dataclass(frozen=True)
class Split:
    """One split of a local dataset: the files it is read from and its item count."""

    files: tuple[str, ...]  # relative to the data dir; hashed into env.json
    count: int
    read: Callable[[Path, Split], list[Row]]


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset: its splits (the first is the evaluation split) and its hub source."""

    name: str
    splits: Mapping[str, Split]
    hub: HubSource

    @property
    def eval_split(self) -> str:
        """The split tasks evaluate on (the first one)."""
        return next(iter(self.splits))


# ----------------------------------------------------------------------------- file readers


def _require_file(path: Path, what: str) -> None:
    if not path.is_file():
        raise DataError(
            f"{path}: missing; expected {what} (point --data-dir or {DATA_DIR_ENV} at a data folder)"
        )


def _read_jsonl(path: Path, keys: tuple[str, ...]) -> list[Row]:
    _require_file(path, f"a JSON-lines file with keys {', '.join(keys)}")
    rows: list[Row] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{path}:{lineno}: not valid JSON ({exc.msg}); the file is truncated or corrupt"
                ) from None
            if not isinstance(obj, dict) or any(k not in obj for k in keys):
                raise DataError(f"{path}:{lineno}: expected a JSON object with keys {', '.join(keys)}")
            rows.append(obj)
    return rows


def _read_csv_text(text: str, path: Path | str, columns: tuple[str, ...]) -> list[dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataError(f"{path}: expected CSV columns {', '.join(columns)}; missing {', '.join(missing)}")
    rows = list(reader)
    for lineno, row in enumerate(rows, start=2):
        if None in row or any(row[c] is None for c in columns):
            raise DataError(f"{path}: row {lineno} has the wrong number of fields (truncated or corrupt CSV)")
    return rows


def _check_count(rows: list[Row], split: Split, where: Path | str) -> list[Row]:
    if len(rows) != split.count:
        raise DataError(f"{where}: {len(rows)} items, expected {split.count} (truncated or wrong file)")
    return rows


def _indexed(rows: Iterable[Row]) -> list[Row]:
    """Rows with id = their index (a hub row's own "id", e.g. ARC's, is replaced: local copies lack it)."""
    return [{**row, "id": str(i)} for i, row in enumerate(rows)]


def _read_gsm8k(root: Path, split: Split) -> list[Row]:
    path = root / split.files[0]
    rows = _read_jsonl(path, ("question", "answer"))
    return _check_count(
        _indexed({"question": r["question"], "answer": r["answer"]} for r in rows), split, path
    )


def _gpqa_reader(subset: str) -> Callable[[Path, Split], list[Row]]:
    def read(root: Path, split: Split) -> list[Row]:
        return read_gpqa(root / split.files[0], subset)

    return read


GPQA_COLUMNS = (
    "Record ID",
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
)


@functools.lru_cache(maxsize=4)
def _decrypt_member(path: str, size: int, mtime_ns: int, member: str, password: bytes) -> bytes:
    """One zip member's bytes, kept in memory: ZipCrypto is decrypted in pure Python (seconds per
    file), and the (size, mtime) key re-reads a file that changed."""
    with zipfile.ZipFile(path) as zf:
        return zf.read(member, pwd=password)


def read_gpqa(path: Path, subset: str, password: bytes = GPQA_ZIP_PASSWORD) -> list[Row]:
    """Rows of gpqa_<subset>.csv, decrypted from GPQA's dataset.zip in memory (nothing written or printed)."""
    split = get_spec(f"gpqa_{subset}").splits["train"]
    member = f"dataset/gpqa_{subset}.csv"
    _require_file(path, "GPQA's password-protected dataset.zip")
    where = f"{path}:{member}"
    stat = path.stat()
    try:
        data = _decrypt_member(str(path.resolve()), stat.st_size, stat.st_mtime_ns, member, password)
    except KeyError:
        raise DataError(f"{path}: no member {member!r}; expected the authors' GPQA dataset.zip") from None
    except RuntimeError as exc:  # zipfile: "Bad password for file ..."
        if "password" in str(exc).lower():
            raise DataError(
                f"{where}: wrong zip password; expected the GPQA authors' published password"
            ) from None
        raise DataError(f"{where}: cannot read ({exc})") from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        # A wrong password passes ZipCrypto's 1-byte check 1 time in 256 and then fails here.
        raise DataError(
            f"{where}: cannot decrypt or inflate ({type(exc).__name__}); wrong password or corrupt zip"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{where}: not UTF-8 text; wrong password or corrupt zip") from None
    rows = _read_csv_text(text, where, GPQA_COLUMNS)
    return _check_count([{"id": r["Record ID"], **r} for r in rows], split, where)


def _read_mmlu(root: Path, split: Split) -> list[Row]:
    out: list[Row] = []
    for rel in split.files:
        path = root / rel
        _require_file(path, "an MMLU CSV with columns question,choice0..choice3,answer")
        subject = path.name.rsplit("_", 1)[0]
        rows = _read_csv_text(
            path.read_text(encoding="utf-8"),
            path,
            ("question", "choice0", "choice1", "choice2", "choice3", "answer"),
        )
        for i, r in enumerate(rows):
            try:
                answer = int(r["answer"])
            except ValueError:
                raise DataError(
                    f"{path}: row {i + 2}: answer {r['answer']!r}, expected an integer 0-3"
                ) from None
            if not 0 <= answer <= 3:
                raise DataError(f"{path}: row {i + 2}: answer {answer}, expected an integer 0-3")
            choices = [r[f"choice{k}"] for k in range(4)]
            out.append(
                {
                    "id": f"{subject}/{i}",
                    "question": r["question"],
                    "subject": subject,
                    "choices": choices,
                    "answer": answer,
                }
            )
    return _check_count(out, split, root / Path(split.files[0]).parent)


ARC_LABELS = ("A", "B", "C", "D")  # the local copy has no labels; every item has 4 choices


def _read_arc(root: Path, split: Split) -> list[Row]:
    """llm-foundry ICL rows {"query": "Question: <q>", "choices", "gold"} -> hub ai2_arc fields."""
    path = root / split.files[0]
    rows = _read_jsonl(path, ("query", "choices", "gold"))
    out: list[Row] = []
    for i, r in enumerate(rows):
        query, choices, gold = r["query"], r["choices"], r["gold"]
        if (
            not query.startswith("Question: ")
            or len(choices) != len(ARC_LABELS)
            or gold not in range(len(choices))
        ):
            raise DataError(f"{path}:{i + 1}: expected query 'Question: ...', 4 choices and gold 0-3")
        out.append(
            {
                "id": str(i),
                "question": query[len("Question: ") :],
                "choices": {"text": list(choices), "label": list(ARC_LABELS)},
                "answerKey": ARC_LABELS[gold],
            }
        )
    return _check_count(out, split, path)


def _read_boolq(root: Path, split: Split) -> list[Row]:
    """llm-foundry rows {"query": "Passage: <p>\\nQuestion: <q>?", "gold"} -> super_glue boolq fields."""
    path = root / split.files[0]
    rows = _read_jsonl(path, ("query", "choices", "gold"))
    out: list[Row] = []
    for i, r in enumerate(rows):
        passage, sep, question = r["query"].rpartition("\nQuestion: ")
        if (
            not sep
            or not passage.startswith("Passage: ")
            or not question.endswith("?")
            or r["gold"] not in (0, 1)
        ):
            raise DataError(f"{path}:{i + 1}: expected query 'Passage: ...\\nQuestion: ...?' and gold 0/1")
        out.append(
            {
                "id": str(i),
                "question": question[:-1],
                "passage": passage[len("Passage: ") :],
                "idx": i,
                "label": r["gold"],
            }
        )
    return _check_count(out, split, path)


def _read_winogrande(root: Path, split: Split) -> list[Row]:
    """llm-foundry rows {"context_options": [s[:blank]+opt1, s[:blank]+opt2], "continuation", "gold"}
    -> hub winogrande fields. The blank position is not stored, so the sentence is rebuilt from the
    options' common prefix (cut back to a word boundary): exact for lm-eval's choices
    (sentence[:blank] + option) and target (text after the blank, stripped), not necessarily
    byte-equal to the original sentence around the blank."""
    path = root / split.files[0]
    rows = _read_jsonl(path, ("context_options", "continuation", "gold"))
    out: list[Row] = []
    for i, r in enumerate(rows):
        options, cont, gold = r["context_options"], r["continuation"], r["gold"]
        if len(options) != 2 or gold not in (0, 1) or cont != cont.strip() or "_" in cont:
            raise DataError(
                f"{path}:{i + 1}: expected 2 context_options, a stripped continuation and gold 0/1"
            )
        common = os.path.commonprefix(options)
        cut = common.rfind(" ") + 1  # keep whole words in the options
        prefix = common[:cut]
        out.append(
            {
                "id": str(i),
                "sentence": f"{prefix}_ {cont}",
                "option1": options[0][cut:],
                "option2": options[1][cut:],
                "answer": str(gold + 1),
            }
        )
    return _check_count(out, split, path)


def _read_lambada(root: Path, split: Split) -> list[Row]:
    """llm-foundry rows {"context", "continuation": last word} -> {"text": context + " " + word}."""
    path = root / split.files[0]
    rows = _read_jsonl(path, ("context", "continuation"))
    out: list[Row] = []
    for i, r in enumerate(rows):
        if " " in r["continuation"]:
            raise DataError(f"{path}:{i + 1}: continuation has a space; expected the passage's last word")
        out.append({"id": str(i), "text": f"{r['context']} {r['continuation']}"})
    return _check_count(out, split, path)


def _read_piqa(root: Path, split: Split) -> list[Row]:
    path, labels_path = root / split.files[0], root / split.files[1]
    rows = _read_jsonl(path, ("goal", "sol1", "sol2"))
    _require_file(labels_path, "PIQA labels, one 0/1 per line")
    labels = labels_path.read_text(encoding="utf-8").split()
    if len(labels) != len(rows) or any(x not in ("0", "1") for x in labels):
        raise DataError(
            f"{labels_path}: {len(labels)} labels for {len(rows)} rows of {path.name}; expected one 0/1 per row"
        )
    out = [
        {"id": str(i), "goal": r["goal"], "sol1": r["sol1"], "sol2": r["sol2"], "label": int(lab)}
        for i, (r, lab) in enumerate(zip(rows, labels, strict=True))
    ]
    return _check_count(out, split, path)


def _read_truthfulqa_mc(root: Path, split: Split) -> list[Row]:
    """TruthfulQA v1 mc_task.json -> hub truthful_qa multiple_choice fields (choice order kept)."""
    path = root / split.files[0]
    _require_file(path, "TruthfulQA's mc_task.json (a JSON list)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg}); the file is truncated or corrupt") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of questions")
    out: list[Row] = []
    for i, q in enumerate(data):
        if not isinstance(q, dict) or not all(k in q for k in ("question", "mc1_targets", "mc2_targets")):
            raise DataError(f"{path}: entry {i}: expected keys question, mc1_targets, mc2_targets")
        targets = {
            k: {"choices": list(q[k]), "labels": [int(v) for v in q[k].values()]}
            for k in ("mc1_targets", "mc2_targets")
        }
        out.append({"id": str(i), "question": q["question"], **targets})
    return _check_count(out, split, path)


def _read_math500(root: Path, split: Split) -> list[Row]:
    path = root / split.files[0]
    keys = ("problem", "solution", "answer", "subject", "level", "unique_id")
    rows = _read_jsonl(path, keys)
    return _check_count([{"id": r["unique_id"], **{k: r[k] for k in keys}} for r in rows], split, path)


def _read_wikitext(root: Path, split: Split) -> list[Row]:
    """The raw test file as hub-style rows: one per line, "" for a blank line, else line + "\\n"."""
    path = root / split.files[0]
    _require_file(path, "the raw WikiText-2 test text (wiki.test.raw, LF line endings)")
    text = path.read_text(encoding="utf-8")
    if not text.endswith("\n") or "\r" in text:
        raise DataError(
            f"{path}: expected LF-terminated lines (the reconstructed wikitext2/derived/wiki.test.raw)"
        )
    lines = text.split("\n")[:-1]
    return _check_count(_indexed({"text": "" if not ln.strip() else ln + "\n"} for ln in lines), split, path)


# ----------------------------------------------------------------------------- the registry


def _mmlu_files(split: str) -> tuple[str, ...]:
    return tuple(f"mmlu/{split}/{s}_{split}.csv" for s in MMLU_SUBJECTS)


def _gpqa(subset: str, count: int) -> DatasetSpec:
    return DatasetSpec(
        name=f"gpqa_{subset}",
        splits={"train": Split(("gpqa/dataset.zip",), count, _gpqa_reader(subset))},
        hub=HubSource("Idavidrein/gpqa", f"gpqa_{subset}", {"train": "train"}, id_field="Record ID"),
    )


def _foundry(
    name: str, path: str, count: int, read: Callable[[Path, Split], list[Row]], hub: HubSource
) -> DatasetSpec:
    return DatasetSpec(name=name, splits={hub_split(hub): Split((path,), count, read)}, hub=hub)


def hub_split(hub: HubSource) -> str:
    """The (only) split of a single-split hub source."""
    return next(iter(hub.splits))


# Counts are those of shared/data/MANIFEST.md (they match the canonical splits).
DATASETS: dict[str, DatasetSpec] = {
    "gsm8k": DatasetSpec(
        name="gsm8k",
        splits={
            "test": Split(("gsm8k/test.jsonl",), 1319, _read_gsm8k),
            "train": Split(("gsm8k/train.jsonl",), 7473, _read_gsm8k),
        },
        hub=HubSource("openai/gsm8k", "main", {"test": "test", "train": "train"}),
    ),
    "gpqa_diamond": _gpqa("diamond", 198),
    "gpqa_main": _gpqa("main", 448),
    "gpqa_extended": _gpqa("extended", 546),
    "mmlu": DatasetSpec(
        name="mmlu",
        splits={
            "test": Split(_mmlu_files("test"), 14042, _read_mmlu),
            "dev": Split(_mmlu_files("dev"), 285, _read_mmlu),
        },
        hub=HubSource("cais/mmlu", "all", {"test": "test", "dev": "dev"}),
    ),
    "arc_challenge": _foundry(
        "arc_challenge",
        "arc_challenge/arc_challenge.jsonl",
        1172,
        _read_arc,
        HubSource("allenai/ai2_arc", "ARC-Challenge", {"test": "test"}),
    ),
    "arc_easy": _foundry(
        "arc_easy",
        "arc_easy/arc_easy.jsonl",
        2376,
        _read_arc,
        HubSource("allenai/ai2_arc", "ARC-Easy", {"test": "test"}),
    ),
    "piqa": DatasetSpec(
        name="piqa",
        splits={"validation": Split(("piqa/valid.jsonl", "piqa/valid-labels.lst"), 1838, _read_piqa)},
        hub=HubSource("baber/piqa", None, {"validation": "validation"}),
    ),
    "boolq": _foundry(
        "boolq",
        "boolq/boolq.jsonl",
        3270,
        _read_boolq,
        HubSource("aps/super_glue", "boolq", {"validation": "validation"}),
    ),
    "winogrande": _foundry(
        "winogrande",
        "winogrande/winogrande.jsonl",
        1267,
        _read_winogrande,
        HubSource("allenai/winogrande", "winogrande_xl", {"validation": "validation"}),
    ),
    "lambada_openai": _foundry(
        "lambada_openai",
        "lambada_openai/lambada_openai.jsonl",
        5153,
        _read_lambada,
        HubSource("EleutherAI/lambada_openai", "default", {"test": "test"}),
    ),
    "truthfulqa_mc": _foundry(
        "truthfulqa_mc",
        "truthfulqa/data/v1/mc_task.json",
        817,
        _read_truthfulqa_mc,
        HubSource("truthfulqa/truthful_qa", "multiple_choice", {"validation": "validation"}),
    ),
    "math500": _foundry(
        "math500",
        "math500/test.jsonl",
        500,
        _read_math500,
        HubSource("HuggingFaceH4/MATH-500", "default", {"test": "test"}, id_field="unique_id"),
    ),
    "wikitext2": _foundry(
        "wikitext2",
        "wikitext2/derived/wiki.test.raw",
        4358,
        _read_wikitext,
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


def resolve_data_dir(arg: str | Path | None) -> Path | None:
    """The data folder: `arg`, else $QA_DATA_DIR, else None (load from the hub)."""
    value = arg if arg not in (None, "") else os.environ.get(DATA_DIR_ENV) or None
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        source = "--data-dir" if arg not in (None, "") else f"${DATA_DIR_ENV}"
        raise DataError(f"{path}: not a folder ({source}); expected a data folder laid out like shared/data")
    return path


def load(name: str, data_dir: Path | None, split: str | None = None) -> list[Row]:
    """Rows of one split (default: the evaluation split) from `data_dir`, or the hub if None."""
    spec = get_spec(name)
    split = split or spec.eval_split
    if split not in spec.splits:
        raise DataError(f"dataset {name!r} has no split {split!r}; splits: {', '.join(spec.splits)}")
    if data_dir is None:
        return _load_hub(spec, split)
    part = spec.splits[split]
    return part.read(Path(data_dir), part)


def dataset_names(names: Iterable[str]) -> list[str]:
    """Dataset names for `names`, each a dataset or a task (mapped by evals.tasks.TASK_DATASETS)."""
    from evals.tasks import TASK_DATASETS  # tasks import this module: resolve at call time

    out: list[str] = []
    for name in names:
        found = (name,) if name in DATASETS else TASK_DATASETS.get(name)
        if found is None:
            get_spec(name)  # raises the did-you-mean DataError
        out.extend(d for d in found or () if d not in out)
    return out


def data_files(names: Iterable[str]) -> list[str]:
    """Relative paths of every local file the named datasets (or tasks) read, without duplicates, sorted."""
    return sorted(
        {f for n in dataset_names(names) for part in get_spec(n).splits.values() for f in part.files}
    )


def data_file_hashes(names: Iterable[str], data_dir: Path | None) -> dict[str, str]:
    """{relative path: sha256} of the local files behind the named datasets or tasks (env.json); {} for hub data."""
    if data_dir is None:
        return {}
    hashes: dict[str, str] = {}
    for rel in data_files(names):
        path = Path(data_dir) / rel
        _require_file(path, "a dataset file listed in evals.data.DATASETS")
        hashes[rel] = sha256_file(path)
    return hashes


# ----------------------------------------------------------------------------- hub fallback

_FALSE = {"0", "false", "no", "off"}


def hub_offline() -> bool:
    """True unless HF_DATASETS_OFFLINE (or HF_HUB_OFFLINE) is set to a false value: offline by default."""
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        value = os.environ.get(var)
        if value is not None:
            return value.strip().lower() not in _FALSE
    return True


def _hub_rows(spec: DatasetSpec, split: str, rows: Iterable[Mapping[str, Any]]) -> list[Row]:
    hub = spec.hub
    if hub.id_field is not None:
        return [{**r, "id": str(r[hub.id_field])} for r in rows]
    if spec.name == "mmlu":
        seen: dict[str, int] = {}
        out = []
        for r in rows:
            i = seen[r["subject"]] = seen.get(r["subject"], -1) + 1
            out.append({**r, "id": f"{r['subject']}/{i}"})
        return out
    return _indexed(dict(r) for r in rows)


def _load_hub(spec: DatasetSpec, split: str) -> list[Row]:
    hub = spec.hub
    where = f"{hub.path}" + (f" ({hub.name})" if hub.name else "") + f" split {hub.splits[split]}"
    offline = hub_offline()
    try:
        import datasets
        import huggingface_hub.constants as hf_constants
    except ImportError:
        raise DataError(
            "hub loading needs the `datasets` package: pip install datasets, or pass --data-dir"
        ) from None
    saved = (datasets.config.HF_HUB_OFFLINE, hf_constants.HF_HUB_OFFLINE)
    try:
        if offline:  # only what is already in the local HF cache; never the network
            datasets.config.HF_HUB_OFFLINE = hf_constants.HF_HUB_OFFLINE = True
        ds = datasets.load_dataset(hub.path, hub.name, split=hub.splits[split])
    except Exception as exc:  # noqa: BLE001 - the hub client raises many types; all mean "not available"
        how = (
            (
                "not in the local HF cache (offline); pass --data-dir, set QA_DATA_DIR, or set HF_DATASETS_OFFLINE=0 "
                "to download"
            )
            if offline
            else f"could not be loaded ({type(exc).__name__}); pass --data-dir"
        )
        raise DataError(f"dataset {spec.name!r}: hub dataset {where} {how}") from None
    finally:
        datasets.config.HF_HUB_OFFLINE, hf_constants.HF_HUB_OFFLINE = saved
    rows = _hub_rows(spec, split, ds)
    expected = spec.splits[split].count
    if len(rows) != expected:
        raise DataError(
            f"dataset {spec.name!r}: hub dataset {where} has {len(rows)} items, expected {expected}"
        )
    return rows


# ----------------------------------------------------------------------------- verification


@dataclass(frozen=True)
class Check:
    """One verification result: a split's item count, or a file's sha256 against manifest.json."""

    dataset: str
    subject: str  # "split <name>" or a file path relative to the data dir
    ok: bool
    detail: str


MANIFEST_FILE = "manifest.json"


def manifest_hashes(data_dir: Path) -> dict[str, str]:
    """{relative path: sha256} from the data dir's manifest.json; {} when there is none."""
    path = Path(data_dir) / MANIFEST_FILE
    if not path.is_file():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        return {f["file"]: f["sha256"] for ds in manifest["datasets"] for f in ds.get("files", [])}
    except (json.JSONDecodeError, KeyError, TypeError):
        raise DataError(f"{path}: expected {{'datasets': [{{'files': [{{'file', 'sha256'}}]}}]}}") from None


def verify(data_dir: Path, names: Iterable[str] | None = None) -> list[Check]:
    """Load every split of the named datasets (default: all) and check counts and shapes, then
    compare each file's sha256 with manifest.json when the data dir has one."""
    names = list(DATASETS) if names is None else list(names)
    expected = manifest_hashes(data_dir)
    checks: list[Check] = []
    for name in names:
        spec = get_spec(name)
        for split, part in spec.splits.items():
            try:
                n = len(part.read(Path(data_dir), part))
                checks.append(Check(name, f"split {split}", True, f"{n} items"))
            except DataError as exc:
                checks.append(Check(name, f"split {split}", False, str(exc)))
        for rel in data_files([name]):
            path = Path(data_dir) / rel
            if not path.is_file():
                checks.append(Check(name, rel, False, "missing"))
            elif rel not in expected:
                checks.append(Check(name, rel, True, "present (no manifest.json entry to compare)"))
            else:
                digest = sha256_file(path)
                ok = digest == expected[rel]
                checks.append(
                    Check(
                        name,
                        rel,
                        ok,
                        "sha256 matches manifest.json"
                        if ok
                        else f"sha256 {digest[:12]}... differs from manifest.json {expected[rel][:12]}...",
                    )
                )
    return checks
