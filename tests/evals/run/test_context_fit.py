"""Every item against the model's context window before any arm starts (evals.run.context_fit), on the real
SmolLM2 tokenizer: RULER items past the window are refused in one line naming the first, items inside it pass, a
multiple-choice task counts its context with its longest continuation and gets a warning, not a refusal; a session
task is measured at each session's last turn and refused exactly where the session runner would refuse it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from evals.errors import EvalError
from evals.run.context_fit import check_fit, first_overflow, longest_turns
from evals.tasks import get_task
from evals.tasks.base import TaskOptions
from tests.shared_data import shared_data_dir


@pytest.fixture(scope="module")
def encode():  # -> Callable[[str], list[int]]
    from evals.errors import ModelError
    from evals.prompts.chat import load_tokenizer

    try:
        return load_tokenizer("smollm2-135m").encode
    except ModelError as exc:
        pytest.skip(str(exc))


def _ruler(lengths: list[int]):  # -> RulerTask
    return get_task("ruler", TaskOptions(max_tokens=32, extra={"per_cell": 1, "lengths": lengths,
                                                               "subtasks": ["niah_single", "vt"]}))


def test_ruler_items_past_the_window_are_named_with_their_tokens(encode) -> None:
    data = shared_data_dir("wikitext2/derived/wiki.test.raw")
    task = _ruler([1024, 4096])
    items = task.items(data)
    over = first_overflow(task, items, 0, encode, 2048)
    assert over is not None and over.count == 2 and over.total == 4
    assert "L4096" in over.item_id and 2048 < over.need <= 4096 + 32 + 64, over  # RULER's budget, ~64 tokens of slack
    assert over.what.startswith("prompt ") and over.what.endswith(" + max_tokens 32")
    assert first_overflow(task, items, 0, encode, 8192) is None
    with pytest.raises(EvalError, match=r"^task ruler: item '.*L4096.*' needs \d+ tokens \(prompt \d+ \+ max_tokens 32\), "
                                        r"more than the 2048-token context window of arm 'b'; 2 of 4 items do not fit: "
                                        r"lower its lengths option"):
        check_fit(task, items, 0, encode, 2048, "arm 'b'")


def test_a_loglikelihood_item_counts_its_context_and_longest_continuation(encode) -> None:
    data = shared_data_dir("arc_easy")
    task = get_task("arc_easy", TaskOptions())
    items = task.items(Path(data))[:20]
    longest = max(len(encode(c + x)) for it in items
                  for c, x in task.request(it, repeat=0, seed=0).pairs())  # type: ignore[union-attr]
    assert first_overflow(task, items, 0, encode, longest) is None
    over = first_overflow(task, items, 0, encode, longest - 1)
    assert over is not None and over.need == longest and over.what == "context + longest continuation"
    assert check_fit(task, items, 0, encode, longest, "arm 'b'") is None
    line = check_fit(task, items, 0, encode, longest - 1, "arm 'b'")  # an lm-eval task: a warning, not a refusal
    assert line is not None and line.startswith(f"task arc_easy: item {over.item_id!r} needs {longest} tokens")
    assert "cuts their prompts' heads as lm-eval does" in line


def test_a_session_task_needs_its_last_turn_and_is_refused_where_the_session_runner_refuses(encode) -> None:
    from evals.run.sessions import check_fits

    data = shared_data_dir("gsm8k")
    task = get_task("sessions", TaskOptions(extra={"sessions": 2, "turns": 3, "asks": "mixed", "context_tokens": 256}))
    items = task.items(data)
    last = longest_turns(items)
    assert [it.item_id for it in last] == ["s000/t3/cold", "s001/t3/cold"]  # each session's last turn, first path
    needs = [len(encode(it.doc["prompt"] + task.reference(it))) + task.max_new_tokens for it in last]
    assert task.max_new_tokens == 256 and min(needs) > 256 + 256  # the context, two turns and GSM8K's budget
    assert needs[0] != needs[1], needs  # seeded: two sessions of different lengths
    assert first_overflow(task, items, 0, encode, max(needs)) is None
    over = first_overflow(task, items, 0, encode, min(needs))
    assert over is not None and over.unit == "sessions" and (over.count, over.total) == (1, 2)
    big = 0 if needs[0] > needs[1] else 1
    assert over.item_id == last[big].item_id and over.need == needs[big]
    assert over.what == f"last turn's prompt and reference {needs[big] - 256} + max_tokens 256"
    with pytest.raises(EvalError, match=rf"^task sessions: item 's00{big}/t3/cold' needs {needs[big]} tokens .*; 1 of 2 "
                                        r"sessions do not fit: lower its context_tokens, turns or max_tokens"):
        check_fit(task, items, 0, encode, max(needs) - 1, "arm 'b'")
    one = [it for it in items if it.doc["session"] == "s000"]  # the session runner measures one longest turn
    for window in (needs[0] - 1, needs[0]):  # an engine that says its window and tokenizer, as hf's and vLLM's do
        engine = SimpleNamespace(max_length=window, tokenizer=SimpleNamespace(encode=encode))
        refused = first_overflow(task, one, 0, encode, window) is not None
        try:
            check_fits(engine, task, one)  # type: ignore[arg-type]
            runner_refused = False
        except EvalError:
            runner_refused = True
        assert refused == runner_refused == (window < needs[0]), window


def test_an_agentic_session_past_the_window_names_session_tokens(encode) -> None:
    data = shared_data_dir("wikitext2")
    task = get_task("agentic", TaskOptions(extra={"sessions": 1, "turns": 8, "session_tokens": 2048,
                                                  "context_tokens": 1024, "paths": ["cold"]}))
    items = task.items(data)
    (last,) = longest_turns(items)
    assert last.item_id == "s000/t8/cold"
    need = len(encode(last.doc["prompt"] + task.reference(last))) + task.max_new_tokens
    assert 2048 * 0.8 < need < 2048 * 1.25, need  # sized to session_tokens (module doc: ~10% tokenizer slack)
    assert check_fit(task, items, 0, encode, need, "arm 'b'") is None
    with pytest.raises(EvalError, match=r"task agentic: .* 1 of 1 sessions do not fit: lower its session_tokens, turns"):
        check_fit(task, items, 0, encode, need - 1, "arm 'b'")
