"""The `ruler` task: RULER's four subtasks built as RULER builds them (needles, keys, values, chains, templates),
on WikiText-2 prose; RULER's string_match_all; lengths inside their budget on the real tokenizers; one-line
errors for bad options."""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

import pytest

from evals.engines.base import GenerateResult
from evals.errors import EvalError
from evals.tasks import get_task
from evals.tasks.base import TaskOptions
from evals.tasks.ruler import RulerTask, approx_tokens, postprocess, string_match_all
from tests.shared_data import shared_data_dir

NEEDLE_RE = re.compile(r"One of the special magic numbers? for ([a-z]+-[a-z]+) is: (\d{7})\.")


@pytest.fixture(scope="module")
def data() -> Path:
    return shared_data_dir("wikitext2/derived/wiki.test.raw")


def task(**extra: object) -> RulerTask:
    built = get_task("ruler", TaskOptions(extra={"per_cell": 3, "lengths": [1024, 2048], **extra}))
    assert isinstance(built, RulerTask)
    return built


def gen(text: str) -> GenerateResult:
    return GenerateResult(text=text, output_tokens=3, finish_reason="stop")


def test_items_are_subtasks_x_lengths_x_per_cell_with_ids_and_meta(data: Path) -> None:
    items = task().items(data)
    assert len(items) == 4 * 2 * 3
    assert items[0].item_id == "niah_single/L1024/0" and items[-1].item_id == "vt/L2048/2"
    assert all(it.cluster is None for it in items) and task().version == "1+ruler-c3f5e3b"
    scored = task().score(items[0], gen("x"))
    assert scored.meta == {"subtask": "niah_single", "length": 1024}


def test_needles_keys_and_values_as_ruler_places_them(data: Path) -> None:
    by = {}
    for it in task().items(data):
        by.setdefault(it.doc["subtask"], []).append(it)
    for it in by["niah_single"]:
        p = it.doc["prompt"]
        assert p.startswith("A special magic number is hidden within the following text.")
        [(key, value)] = NEEDLE_RE.findall(p)
        assert it.doc["outputs"] == [value] and p.endswith(f"The special magic number for {key} mentioned in the "
                                                            "provided text is")
    for it in by["niah_multikey"]:
        needles = NEEDLE_RE.findall(it.doc["prompt"])
        assert len({k for k, _ in needles}) == 4 and len(it.doc["outputs"]) == 1
        asked = it.doc["prompt"].rsplit("for ", 1)[1].split(" mentioned")[0]
        assert dict(needles)[asked] == it.doc["outputs"][0]
    for it in by["niah_multivalue"]:
        needles = NEEDLE_RE.findall(it.doc["prompt"])
        assert len({k for k, _ in needles}) == 1 and sorted(v for _, v in needles) == sorted(it.doc["outputs"])
        assert it.doc["prompt"].startswith("Some special magic numbers are hidden")
        assert it.doc["prompt"].endswith("mentioned in the provided text are")
    for it in by["vt"]:
        p, names = it.doc["prompt"], it.doc["outputs"]
        value = re.search(rf"VAR {names[0]} = (\d{{5}})\n", p).group(1)  # type: ignore[union-attr]
        for a, b in pairwise(names):
            assert p.count(f"\nVAR {b} = VAR {a} \n") == 1  # RULER's chain line, its trailing space kept
        assert p.index(f"VAR {names[0]} =") < p.index(f"VAR {names[4]} =")  # the chain in order
        assert p.endswith(f"5 variables are assigned the value {value}, they are: ")


def test_string_match_all_is_rulers_and_the_reference_scores_one(data: Path) -> None:
    assert string_match_all("the numbers are 1234567 and 7654321", ["1234567", "7654321"]) == 1.0
    assert string_match_all("ABCDE and fghij", ["abcde", "FGHIJ", "KLMNO"]) == pytest.approx(2 / 3)
    assert postprocess("  a\x01b\t ") == "a\nb"
    t = task()
    for it in t.items(data):
        s = t.score(it, gen(t.reference(it)))
        assert s.scores == {"string_match_all,none": 1.0, "all_present,none": 1.0}
    multi = next(it for it in t.items(data) if it.doc["subtask"] == "niah_multivalue")
    half = t.score(multi, gen(" " + " ".join(multi.doc["outputs"][:2])))
    assert half.scores == {"string_match_all,none": 0.5, "all_present,none": 0.0}


def test_the_haystack_is_wikitext_prose_and_token_counts_are_approximated(data: Path) -> None:
    it = task(subtasks=["niah_single"]).items(data)[0]
    assert "@-@" in it.doc["prompt"] or " , " in it.doc["prompt"]  # WikiText's tokenization marks
    assert approx_tokens("The cat sat .") == pytest.approx(1.0 * 3 + 1.2)
    assert approx_tokens("Temnospondyli 12") == pytest.approx(1 + 0.2 * 7 + 2 * 1.2)


def test_lengths_stay_inside_their_budget_on_smollm2(data: Path) -> None:
    from evals.errors import ModelError
    from evals.models.resolve import resolve_model

    try:
        path = resolve_model("smollm2-135m").path
    except ModelError as exc:
        pytest.skip(f"SmolLM2 not available: {exc}")
    from transformers import AutoTokenizer  # heavy: only to count tokens

    tok = AutoTokenizer.from_pretrained(path)
    t = task(lengths=[8192], per_cell=2)
    for it in t.items(data):
        used = len(tok.encode(it.doc["prompt"])) + t.request(it, repeat=0, seed=0).max_tokens
        assert 0.8 * 8192 < used <= 8192, (it.item_id, used)


@pytest.mark.parametrize(("extra", "match"), [
    ({"lengths": [100]}, "lengths must be a non-empty list of distinct token lengths >= 256"),
    ({"lengths": [2048, 2048]}, "distinct"),
    ({"lengths": []}, "non-empty"),
    ({"subtasks": ["niah_single", "qa"]}, "subtasks must be a non-empty list of distinct names among"),
    ({"per_cell": 0}, "per_cell must be an integer >= 1"),
    ({"depths": [0.5]}, r"unknown option\(s\) \['depths'\]"),
])
def test_bad_options_are_one_line_errors(extra: dict[str, object], match: str) -> None:
    with pytest.raises(EvalError, match=match) as err:
        task(**extra)
    assert "\n" not in str(err.value)


def test_a_length_without_room_for_the_budget_is_refused() -> None:
    with pytest.raises(EvalError, match="length 300 leaves no room for the prompt after a generation budget of 400"):
        get_task("ruler", TaskOptions(max_tokens=400, extra={"lengths": [300, 2048]}))
    with pytest.raises(EvalError, match="chat = true is not supported"):
        get_task("ruler", TaskOptions(chat=True), model="smollm2-135m")
