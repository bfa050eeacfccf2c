"""Local-folder readers, one per dataset: each reads the files of one split of a folder laid out
like `shared/data` and returns rows in the field layout of the canonical hub dataset plus a stable
string `id`. Local files that are conversions (llm-foundry's ICL jsonl for ARC, BoolQ, WinoGrande,
LAMBADA) are mapped back to the hub fields; `evals.data.registry.DATA_NOTES` says how."""

from __future__ import annotations

import json
import os
from pathlib import Path

from evals.data.files import check_count, index_ids, read_csv_text, read_jsonl, require_file
from evals.data.spec import Row, Split
from evals.errors import DataError

ARC_LABELS = ("A", "B", "C", "D")  # the local copy has no labels; every item has 4 choices
MMLU_COLUMNS = ("question", "choice0", "choice1", "choice2", "choice3", "answer")
MATH500_KEYS = ("problem", "solution", "answer", "subject", "level", "unique_id")


def read_gsm8k(root: Path, split: Split) -> list[Row]:
    """GSM8K jsonl {"question", "answer"}; id = the row index."""
    path = root / split.files[0]
    rows = read_jsonl(path, ("question", "answer"))
    return check_count(index_ids({"question": r["question"], "answer": r["answer"]} for r in rows), split, path)


def read_mmlu(root: Path, split: Split) -> list[Row]:
    """One CSV per subject (question, choice0..3, answer 0-3) -> cais/mmlu fields; id = subject/index."""
    out: list[Row] = []
    for rel in split.files:
        path = root / rel
        require_file(path, "an MMLU CSV with columns question,choice0..choice3,answer")
        subject = path.name.rsplit("_", 1)[0]
        rows = read_csv_text(path.read_text(encoding="utf-8"), path, MMLU_COLUMNS)
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
    return check_count(out, split, root / Path(split.files[0]).parent)


def read_arc(root: Path, split: Split) -> list[Row]:
    """llm-foundry ICL rows {"query": "Question: <q>", "choices", "gold"} -> hub ai2_arc fields."""
    path = root / split.files[0]
    rows = read_jsonl(path, ("query", "choices", "gold"))
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
    return check_count(out, split, path)


def read_boolq(root: Path, split: Split) -> list[Row]:
    """llm-foundry rows {"query": "Passage: <p>\\nQuestion: <q>?", "gold"} -> super_glue boolq fields."""
    path = root / split.files[0]
    rows = read_jsonl(path, ("query", "choices", "gold"))
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
    return check_count(out, split, path)


def read_winogrande(root: Path, split: Split) -> list[Row]:
    """llm-foundry rows {"context_options": [s[:blank]+opt1, s[:blank]+opt2], "continuation", "gold"}
    -> hub winogrande fields. The blank position is not stored, so the sentence is rebuilt from the
    options' common prefix (cut back to a word boundary): exact for lm-eval's choices
    (sentence[:blank] + option) and target (text after the blank, stripped), not necessarily
    byte-equal to the original sentence around the blank."""
    path = root / split.files[0]
    rows = read_jsonl(path, ("context_options", "continuation", "gold"))
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
    return check_count(out, split, path)


def read_lambada(root: Path, split: Split) -> list[Row]:
    """llm-foundry rows {"context", "continuation": last word} -> {"text": context + " " + word}."""
    path = root / split.files[0]
    rows = read_jsonl(path, ("context", "continuation"))
    out: list[Row] = []
    for i, r in enumerate(rows):
        if " " in r["continuation"]:
            raise DataError(f"{path}:{i + 1}: continuation has a space; expected the passage's last word")
        out.append({"id": str(i), "text": f"{r['context']} {r['continuation']}"})
    return check_count(out, split, path)


def read_piqa(root: Path, split: Split) -> list[Row]:
    """PIQA's valid.jsonl {"goal", "sol1", "sol2"} plus valid-labels.lst (one 0/1 per row)."""
    path, labels_path = root / split.files[0], root / split.files[1]
    rows = read_jsonl(path, ("goal", "sol1", "sol2"))
    require_file(labels_path, "PIQA labels, one 0/1 per line")
    labels = labels_path.read_text(encoding="utf-8").split()
    if len(labels) != len(rows) or any(x not in ("0", "1") for x in labels):
        raise DataError(
            f"{labels_path}: {len(labels)} labels for {len(rows)} rows of {path.name}; expected one 0/1 per row"
        )
    out = [
        {"id": str(i), "goal": r["goal"], "sol1": r["sol1"], "sol2": r["sol2"], "label": int(lab)}
        for i, (r, lab) in enumerate(zip(rows, labels, strict=True))
    ]
    return check_count(out, split, path)


def read_truthfulqa_mc(root: Path, split: Split) -> list[Row]:
    """TruthfulQA v1 mc_task.json -> hub truthful_qa multiple_choice fields (choice order kept)."""
    path = root / split.files[0]
    require_file(path, "TruthfulQA's mc_task.json (a JSON list)")
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
    return check_count(out, split, path)


def read_math500(root: Path, split: Split) -> list[Row]:
    """MATH-500 test.jsonl with its hub fields; id = the dataset's unique_id."""
    path = root / split.files[0]
    rows = read_jsonl(path, MATH500_KEYS)
    return check_count([{"id": r["unique_id"], **{k: r[k] for k in MATH500_KEYS}} for r in rows], split, path)


def read_wikitext(root: Path, split: Split) -> list[Row]:
    """The raw test file as hub-style rows: one per line, "" for a blank line, else line + "\\n"."""
    path = root / split.files[0]
    require_file(path, "the raw WikiText-2 test text (wiki.test.raw, LF line endings)")
    text = path.read_text(encoding="utf-8")
    if not text.endswith("\n") or "\r" in text:
        raise DataError(
            f"{path}: expected LF-terminated lines (the reconstructed wikitext2/derived/wiki.test.raw)"
        )
    lines = text.split("\n")[:-1]
    return check_count(index_ids({"text": "" if not ln.strip() else ln + "\n"} for ln in lines), split, path)
