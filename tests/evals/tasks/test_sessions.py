"""The `sessions` probe: sessions built from the local GSM8K data, prompts that extend turn by turn with
the reference answers, the scorer, and one-line errors for options that cannot build a session."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from evals.engines.base import GenerateResult
from evals.errors import EvalError
from evals.tasks import get_task
from evals.tasks.base import TaskOptions
from evals.tasks.sessions import SessionsTask, path_names
from tests.shared_data import shared_data_dir


@pytest.fixture(scope="module")
def data() -> Path:
    return shared_data_dir("gsm8k/test.jsonl")


def task(**extra: object) -> SessionsTask:
    built = get_task("sessions", TaskOptions(extra={"context_tokens": 256, "turns": 3, "sessions": 2, **extra}))
    assert isinstance(built, SessionsTask)
    return built


def test_items_are_sessions_x_turns_x_paths_with_ids_and_clusters(data: Path) -> None:
    t = task(shuffles=2)
    items = t.items(data)
    assert path_names(2) == ["cold", "warm", "shuffled", "shuffled2"]
    assert len(items) == 2 * 3 * 4
    assert items[0].item_id == "s000/t1/cold" and items[3].item_id == "s000/t1/shuffled2"
    assert items[-1].item_id == "s001/t3/shuffled2"
    assert {it.cluster for it in items} == {"s000", "s001"}
    assert all(it.item_id.startswith(it.cluster + "/") for it in items)


def test_each_turn_extends_the_previous_turn_with_its_reference_answer(data: Path) -> None:
    t = task(asks="mixed")
    cold = [it for it in t.items(data) if it.doc["path"] == "cold" and it.cluster == "s000"]
    assert [it.doc["ask"] for it in cold] == ["lookup", "gsm8k", "lookup"]
    for prev, cur in pairwise(cold):
        expected_head = prev.doc["prompt"] + t.reference(prev) + "\n\n"
        assert cur.doc["prompt"].startswith(expected_head)
        assert cur.doc["prompt"].endswith("\nAnswer:")
    context = t.session_context(cold[0])
    assert all(it.doc["prompt"].startswith(context) for it in cold)
    assert "Reference facts:" in context and "Worked examples:" in context


def test_every_path_of_a_turn_sends_the_same_prompt(data: Path) -> None:
    t = task()
    by_turn: dict[str, set[str]] = {}
    for it in t.items(data):
        req = t.request(it, repeat=0, seed=0)
        by_turn.setdefault(it.item_id.rsplit("/", 1)[0], set()).add(t.prompt_text(req))
    assert all(len(prompts) == 1 for prompts in by_turn.values())


def test_sessions_are_seeded_and_differ_between_sessions_and_seeds(data: Path) -> None:
    a, b = task().items(data), task().items(data)
    assert [i.doc["prompt"] for i in a] == [i.doc["prompt"] for i in b]
    assert task().session_context(a[0]) != task().session_context(a[-1])  # s000 vs s001
    other = task(seed=7).items(data)
    assert other[0].doc["prompt"] != a[0].doc["prompt"]


def test_lookup_facts_are_in_the_context_and_gsm8k_turns_are_distinct_test_problems(data: Path) -> None:
    t = task(asks="lookup", turns=4)
    for it in t.items(data):
        if it.doc["path"] == "cold":
            assert f"{it.doc['source']}: {it.doc['answer']}\n" in t.session_context(it)
    g = task(asks="gsm8k", turns=3, sessions=3)
    sources = [it.doc["source"] for it in g.items(data) if it.doc["path"] == "cold"]
    assert len(sources) == len(set(sources)) == 9


def test_context_size_follows_context_tokens(data: Path) -> None:
    small, large = task(context_tokens=256), task(context_tokens=2048)
    s = small.session_context(small.items(data)[0])
    big = large.session_context(large.items(data)[0])
    assert len(big) > 4 * len(s)
    assert len(big) < 2048 * 2.8 * 1.2  # no more than the chars the estimate allows, plus the headers


def test_scoring_both_kinds_under_the_same_metrics(data: Path) -> None:
    t = task(asks="mixed")
    lookup, gsm = [it for it in t.items(data) if it.doc["path"] == "cold"][:2]
    value = lookup.doc["answer"]
    right = t.score(lookup, GenerateResult(text=f" {value}.", output_tokens=3, finish_reason="stop"))
    assert right.scores == {"exact_match,strict-match": 1.0, "exact_match,flexible-extract": 1.0}
    assert right.meta == {"ask": "lookup"} and right.target == value
    wrong = t.score(lookup, GenerateResult(text=" 12 or 13", output_tokens=3, finish_reason="stop"))
    assert wrong.scores == {"exact_match,strict-match": 0.0, "exact_match,flexible-extract": 0.0}
    number = gsm.doc["answer"].split("####")[-1].strip()
    solved = t.score(gsm, GenerateResult(text=f" so it is\n#### {number}", output_tokens=9, finish_reason="stop"))
    assert solved.scores == {"exact_match,strict-match": 1.0, "exact_match,flexible-extract": 1.0}
    assert solved.meta == {"ask": "gsm8k"}


def test_reference_request_is_the_answer_given_the_prompt(data: Path) -> None:
    t = task()
    it = t.items(data)[0]
    req = t.reference_request(it)
    assert req.context == it.doc["prompt"] and req.text == " " + it.doc["answer"]


@pytest.mark.parametrize(("options", "message"), [
    ({"asks": "trivia"}, "option asks must be one of gsm8k, lookup, mixed"),
    ({"turns": 0}, "option turns must be an integer >= 1"),
    ({"context_tokens": 10}, "option context_tokens must be an integer >= 128"),
    ({"shuffle_batch": 1}, "option shuffle_batch must be an integer >= 2"),
    ({"colour": 1}, "unknown option(s) ['colour']"),
])
def test_bad_options_are_one_line_errors(options: dict[str, object], message: str) -> None:
    with pytest.raises(EvalError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")) as err:
        task(**options)
    assert "\n" not in str(err.value)


def test_too_few_gsm8k_problems_for_sessions_x_turns_is_one_line(data: Path) -> None:
    t = task(asks="gsm8k", sessions=700, turns=2)
    with pytest.raises(EvalError, match="700 sessions x 2 GSM8K turns need 1400 test problems; the data has 1319"):
        t.items(data)


def test_chat_and_fewshot_are_refused() -> None:
    with pytest.raises(EvalError, match="chat = true is not supported"):
        get_task("sessions", TaskOptions(chat=True), model="smollm2-135m")
    with pytest.raises(EvalError, match="num_fewshot does not apply"):
        get_task("sessions", TaskOptions(num_fewshot=2))
