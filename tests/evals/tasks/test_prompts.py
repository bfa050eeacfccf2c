"""The prompts this toolkit sends are byte-identical to those lm-eval's own task objects build.

For each task, lm-eval's YAML (from the installed lm_eval package) is turned into a real
`ConfigurableTask`, fed the same documents through `custom_dataset` (in memory: nothing is written,
so GPQA stays decrypted in memory only), and asked to `build_all_requests` for the first items.
Its contexts, continuations and stop strings are compared with ours by sha256 only, so a failure
never prints a question (GPQA's authors ask that questions not be revealed).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import random
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import lm_eval
import pytest
from lm_eval.api.task import ConfigurableTask
from lm_eval.defaults import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED
from lm_eval.tasks._yaml_loader import load_yaml

from evals import data
from evals.engines.base import GenerateRequest, LoglikelihoodRequest
from evals.tasks import get_task, gpqa, winogrande
from evals.tasks.base import Item, TaskOptions
from tests.shared_data import SHARED_DATA

DATA_DIR = SHARED_DATA
LM_TASKS = Path(lm_eval.__file__).parent / "tasks"
N_ITEMS = 6  # first items of each task (lm-eval's few-shot RNG is sequential from item 0)

pytestmark = pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data")
logging.getLogger("lm_eval").setLevel(logging.ERROR)
datasets.disable_progress_bars()


def h(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def lm_doc(doc: Any) -> dict[str, Any]:
    """Our document as lm-eval sees it: the row itself (the few-shot block is `Item.fewshot`, not a key)."""
    assert not any(k.startswith("_") for k in doc)
    return dict(doc)


def lm_task(
    yaml_rel: str, splits: dict[str, list[dict[str, Any]]], num_fewshot: int | None = None, **overrides: Any
) -> ConfigurableTask:
    """lm-eval's task from its YAML, its dataset replaced by in-memory documents."""
    cfg = load_yaml(LM_TASKS / yaml_rel, resolve_func=True)
    for key in ("tag", "group"):
        cfg.pop(key, None)
    names = {cfg.get(k) for k in ("training_split", "validation_split", "test_split", "fewshot_split")} - {
        None
    }
    eval_split = cfg.get("test_split") or cfg.get("validation_split")
    default = splits.get(eval_split) or next(iter(splits.values()))
    dsd = datasets.DatasetDict({n: datasets.Dataset.from_list(splits.get(n, default)) for n in names})
    cfg.update(custom_dataset=lambda **_: dsd, dataset_kwargs=None, **overrides)
    task = ConfigurableTask(config=cfg)
    # what simple_evaluate does after loading: default num_fewshot 0, then the few-shot seed
    k = num_fewshot if num_fewshot is not None else (task.get_config("num_fewshot") or 0)
    task.set_config(key="num_fewshot", value=k)
    task.set_fewshot_seed(seed=DEFAULT_OTHER_SEED)
    return task


def lm_requests(task: ConfigurableTask, n: int) -> list[list[tuple[Any, ...]]]:
    """lm-eval's request arguments for the first n documents, grouped per document."""
    task.build_all_requests(limit=n)
    by_doc: dict[int, list[Any]] = {}
    for inst in sorted(task.instances, key=lambda i: (i.doc_id, i.idx)):
        by_doc.setdefault(inst.doc_id, []).append(inst.arguments)
    return [by_doc[i] for i in range(n)]


def ours(task_name: str, items: list[Item], options: TaskOptions | None = None) -> list[Any]:
    task = get_task(task_name, options)
    return [task.request(it, repeat=0, seed=0) for it in items]


def assert_ll_identical(mine: list[LoglikelihoodRequest], theirs: list[list[tuple[Any, ...]]]) -> None:
    assert len(mine) == len(theirs)
    for req, args in zip(mine, theirs, strict=True):
        assert [h(req.context)] * len(args) == [h(a[0]) for a in args], "context differs"
        assert [h(c) for c in req.continuations] == [h(a[1]) for a in args], "continuations differ"


def assert_gen_identical(mine: list[GenerateRequest], theirs: list[list[tuple[Any, ...]]]) -> None:
    assert len(mine) == len(theirs)
    for req, (args,) in zip(mine, theirs, strict=True):
        assert h(req.prompt) == h(args[0]), "prompt differs"
        assert list(req.until) == list(args[1]["until"])
        if req.prefix is not None:
            assert req.prompt.startswith(req.prefix)


def first_items(task_name: str, n: int = N_ITEMS, options: TaskOptions | None = None) -> list[Item]:
    return get_task(task_name, options).items(DATA_DIR)[:n]


# ----------------------------------------------------------------------------- generative


def test_gsm8k_5shot_prompts_identical() -> None:
    items = first_items("gsm8k")
    train = data.load("gsm8k", DATA_DIR, "train")
    task = lm_task(
        "gsm8k/gsm8k.yaml", {"test": [lm_doc(i.doc) for i in items], "train": [lm_doc(d) for d in train]}
    )
    assert task.get_config("num_fewshot") == 5
    mine = ours("gsm8k", items)
    assert_gen_identical(mine, lm_requests(task, len(items)))
    assert all(r.prefix is None for r in mine)  # shots differ per item: nothing shared to cache


def test_gsm8k_other_shot_counts_identical() -> None:
    opts = TaskOptions(num_fewshot=2)
    items = first_items("gsm8k", 4, opts)
    train = data.load("gsm8k", DATA_DIR, "train")
    task = lm_task(
        "gsm8k/gsm8k.yaml",
        {"test": [lm_doc(i.doc) for i in items], "train": [lm_doc(d) for d in train]},
        num_fewshot=2,
    )
    assert_gen_identical(ours("gsm8k", items, opts), lm_requests(task, len(items)))


@pytest.mark.parametrize("subset", ["diamond", "main"])
def test_gpqa_cot_prompts_identical(subset: str) -> None:
    items = first_items(f"gpqa_{subset}_cot_zeroshot")
    docs = [lm_doc(i.doc) for i in items]
    task = lm_task(f"gpqa/cot_zeroshot/gpqa_{subset}_cot_zeroshot.yaml", {"train": docs}, process_docs=None)
    assert_gen_identical(ours(f"gpqa_{subset}_cot_zeroshot", items), lm_requests(task, len(items)))


def _minerva_stubs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let lm-eval's minerva utils import without its math extras (only prompt code is used)."""
    try:
        import math_verify  # noqa: F401

        return
    except ImportError:
        pass
    fake_mv = types.ModuleType("math_verify")
    fake_mv.parse = fake_mv.verify = lambda *a, **k: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "math_verify", fake_mv)
    monkeypatch.setitem(sys.modules, "antlr4", types.ModuleType("antlr4"))
    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: "4.11.0" if name == "antlr4-python3-runtime" else real_version(name),
    )


def test_math500_minerva_prompts_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    _minerva_stubs(monkeypatch)
    items = first_items("math500")
    task = lm_task("minerva_math/minerva_math500.yaml", {"test": [lm_doc(i.doc) for i in items]})
    assert task.get_config("num_fewshot") == 4
    mine = ours("math500", items)
    assert_gen_identical(mine, lm_requests(task, len(items)))
    assert len({r.prefix for r in mine}) == 1 and mine[0].prefix  # one shared few-shot block


# ----------------------------------------------------------------------------- multiple choice


@pytest.mark.parametrize(
    ("name", "yaml_rel"),
    [
        ("arc_easy", "arc/arc_easy.yaml"),
        ("arc_challenge", "arc/arc_challenge.yaml"),
        ("piqa", "piqa/piqa.yaml"),
        ("boolq", "super_glue/boolq/default.yaml"),
        ("truthfulqa_mc1", "truthfulqa/truthfulqa_mc1.yaml"),
        ("truthfulqa_mc2", "truthfulqa/truthfulqa_mc2.yaml"),
        ("lambada_openai", "lambada/lambada_openai.yaml"),
    ],
)
def test_loglikelihood_prompts_identical(name: str, yaml_rel: str) -> None:
    items = first_items(name)
    task = lm_task(yaml_rel, {"_": [lm_doc(i.doc) for i in items]})
    assert_ll_identical(ours(name, items), lm_requests(task, len(items)))


@pytest.mark.parametrize("subset", ["diamond", "main"])
def test_gpqa_zeroshot_prompts_identical(subset: str) -> None:
    items = first_items(f"gpqa_{subset}_zeroshot")
    task = lm_task(
        f"gpqa/zeroshot/gpqa_{subset}_zeroshot.yaml",
        {"train": [lm_doc(i.doc) for i in items]},
        process_docs=None,
    )
    assert_ll_identical(ours(f"gpqa_{subset}_zeroshot", items), lm_requests(task, len(items)))


def _mmlu_items(subjects: tuple[str, ...], k: int) -> dict[str, list[Item]]:
    items = get_task("mmlu", TaskOptions(num_fewshot=k)).items(DATA_DIR)
    return {s: [i for i in items if i.doc["subject"] == s][:3] for s in subjects}


@pytest.mark.parametrize("k", [0, 5])
def test_mmlu_prompts_identical(k: int) -> None:
    subjects = ("abstract_algebra", "high_school_european_history", "world_religions")
    dev = data.load("mmlu", DATA_DIR, "dev")
    for subject, items in _mmlu_items(subjects, k).items():
        task = lm_task(
            f"mmlu/default/mmlu_{subject}.yaml",
            {"test": [lm_doc(i.doc) for i in items], "dev": [d for d in dev if d["subject"] == subject]},
            num_fewshot=k,
        )
        mine = ours("mmlu", items, TaskOptions(num_fewshot=k))
        assert_ll_identical(mine, lm_requests(task, len(items)))
        assert all(r.prefix and r.context.startswith(r.prefix) for r in mine)


def test_mmlu_descriptions_match_every_subject_yaml() -> None:
    from evals.tasks.multiple_choice import mmlu_description

    for subject in data.MMLU_SUBJECTS:
        cfg = load_yaml(LM_TASKS / f"mmlu/default/mmlu_{subject}.yaml", resolve_func=False, recursive=False)
        assert mmlu_description({"subject": subject}) == cfg["description"], subject


def test_winogrande_partial_contexts_identical() -> None:
    items = first_items("winogrande")
    task = lm_task("winogrande/default.yaml", {"_": [lm_doc(i.doc) for i in items]})
    theirs = lm_requests(task, len(items))
    for item, args in zip(items, theirs, strict=True):
        pairs = winogrande.partial_pairs(item.doc)
        assert [(h(c), h(t)) for c, t in pairs] == [(h(a[0]), h(a[1])) for a in args]


# ----------------------------------------------------------------------------- GPQA option order


def test_gpqa_shuffle_equals_lm_eval_process_docs_first_pass() -> None:
    """Our Random(0) shuffle equals lm-eval's process_docs run once after simple_evaluate's random.seed(0)."""
    from lm_eval.tasks.gpqa.zeroshot import utils as lm_gpqa_utils

    rows = data.load("gpqa_diamond", DATA_DIR)
    state = random.getstate()
    try:
        random.seed(DEFAULT_RANDOM_SEED)
        theirs = lm_gpqa_utils.process_docs(datasets.Dataset.from_list(rows))
    finally:
        random.setstate(state)
    mine = gpqa.shuffle_choices(rows)
    keys = ("choice1", "choice2", "choice3", "choice4", "answer")
    assert [h("\x00".join(d[k] for k in keys)) for d in mine] == [
        h("\x00".join(d[k] for k in keys)) for d in theirs
    ]


def _synthetic_gpqa(n: int) -> Iterator[dict[str, str]]:
    for i in range(n):  # GPQA-shaped rows with made-up text: safe to write to disk
        yield {
            "Record ID": f"rec{i}",
            "Question": f"q{i}",
            "Correct Answer": f"right {i}",
            "Incorrect Answer 1": f"wrong a{i}",
            "Incorrect Answer 2": f"wrong b{i}",
            "Incorrect Answer 3": f"wrong c{i}",
        }


def test_gpqa_lm_eval_with_cached_dataset_uses_first_shuffle_pass(tmp_path: Path) -> None:
    """With an Arrow-backed (cached) dataset, as from the hub, lm-eval's eval docs are the first
    process_docs pass after random.seed(0): the order `shuffle_choices` reproduces."""
    rows = list(_synthetic_gpqa(40))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "ds"))
    on_disk = datasets.load_from_disk(str(tmp_path / "ds"))
    state = random.getstate()
    try:
        random.seed(DEFAULT_RANDOM_SEED)
        cfg = load_yaml(LM_TASKS / "gpqa/zeroshot/gpqa_diamond_zeroshot.yaml", resolve_func=True)
        cfg.pop("tag", None)
        cfg.update(custom_dataset=lambda **_: on_disk)
        task = ConfigurableTask(config=cfg)
        theirs = [task.doc_to_text(d) for d in task.eval_docs]
    finally:
        random.setstate(state)
    mine = [gpqa.zeroshot_text(d) for d in gpqa.shuffle_choices([{"id": r["Record ID"], **r} for r in rows])]
    assert theirs == mine
