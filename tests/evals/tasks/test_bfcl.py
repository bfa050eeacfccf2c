"""BFCL's multi-turn base read from the installed bfcl-eval wheel (evals.tasks.bfcl) and the agentic_bfcl task
built on it: every entry's ground-truth calls decode and pass the AST checker as BFCL's own checker passes
them, results come from BFCL's executor deterministically, the sessions hold entry ids, and the options that
do not apply are refused. Skipped where bfcl-eval is not installed."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path
from typing import Any

import pytest

from evals.engines.base import GenerateResult
from evals.errors import EvalError
from evals.tasks import get_task
from evals.tasks.base import TaskOptions
from evals.tasks.tool_calls import Call, decode_calls, render_calls
from qa.report.examples import redacted
from tests.evals.tasks.bfcl_fixtures import same_verdict
from tests.shared_data import shared_data_dir

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None, reason="bfcl-eval is not installed")


@pytest.fixture(scope="module")
def entries() -> list[Any]:
    from evals.tasks.bfcl import load_entries

    return load_entries()


def test_every_entry_is_read_with_results_and_the_load_is_deterministic(entries: list[Any]) -> None:
    from evals.tasks.bfcl import load_entries

    assert len(entries) == 200 and entries[0].id == "multi_turn_base_0"
    assert all(e.turns and e.docs for e in entries)
    again = load_entries([entries[5].id, entries[0].id])  # fresh API instances, another order
    assert again[1].turns == entries[0].turns and again[0].turns == entries[5].turns
    for t in entries[0].turns:
        results = json.loads(t.result)
        assert isinstance(results, list) and len(results) == len(t.calls) and all(isinstance(r, str) for r in results)


def test_ground_truth_passes_our_checker_and_bfcls_alike(bfcl: tuple[Any, Any, Any], entries: list[Any]) -> None:
    checked = 0
    for e in entries:
        for t in (t for t in e.turns if t.calls):  # 3 turns expect no call (agentic_bfcl leaves them out)
            assert decode_calls(t.answer) is not None
            if len({c.name for c in t.calls}) == len(t.calls):  # BFCL's ordered checker keys answers by name
                docs = [next(d for d in e.docs if d["name"] == c.name) for c in t.calls]
                assert same_verdict(bfcl, docs, t.answer, list(t.answers)), (e.id, t.answer)
                checked += 1
    assert checked > 300


def test_perturbed_ground_truth_fails_as_bfcl_says(bfcl: tuple[Any, Any, Any], entries: list[Any]) -> None:
    rng, checked = random.Random(3), 0
    for e in rng.sample(entries, 40):
        t = e.turns[0]
        if len(t.calls) != 1 or not t.calls[0].args:
            continue
        call, doc = t.calls[0], next(d for d in e.docs if d["name"] == t.calls[0].name)
        p = rng.choice(sorted(call.args))
        v = call.args[p]
        bad = v + "_x" if isinstance(v, str) else not v if isinstance(v, bool) else v + 7 if isinstance(
            v, int | float) else None
        if bad is None:
            continue
        assert not same_verdict(bfcl, [doc], render_calls([Call(call.name, {**call.args, p: bad})]), list(t.answers))
        checked += 1
    assert checked >= 5


def test_positional_ground_truth_is_named_by_the_doc_order(entries: list[Any]) -> None:
    from evals.tasks.bfcl import ground_truth_call, possible_answer

    doc = {"name": "sort", "parameters": {"type": "dict", "properties": {
        "file_name": {"type": "string"}, "reverse": {"type": "boolean", "default": False}}, "required": ["file_name"]}}
    call = ground_truth_call("sort('a.txt')", doc)
    assert call == Call("sort", {"file_name": "a.txt"})
    assert possible_answer(call, doc) == {"sort": {"file_name": ["a.txt"], "reverse": [False, ""]}}


def test_agentic_bfcl_sessions_hold_entry_ids_and_reference_calls_score_one() -> None:
    data = shared_data_dir("gsm8k/test.jsonl")
    task = get_task("agentic_bfcl", TaskOptions(extra={"sessions": 2, "turns": 8}))
    assert task.version == "1+bfcl-2026.3.23-ast" and redacted("agentic_bfcl")
    items = [it for it in task.items(data) if it.doc["path"] == "cold"]
    tools = [it for it in items if it.doc["ask"] == "tool"]
    assert tools and {it.doc["tool"]["source"] for it in tools} <= {f"multi_turn_base_{i}" for i in range(200)}
    for it in tools:
        s = task.score(it, GenerateResult(text=task.reference(it), output_tokens=1, finish_reason="stop"))
        assert s.scores["exact_match,strict-match"] == 1.0 and s.meta["tool_source"] == it.doc["tool"]["source"]
        assert f'"name": "{it.doc["tool"]["docs"][0]["name"]}"' in task.session_context(it)
    assert all(sum(it.cluster == s for it in items) <= 8 for s in ("s000", "s001"))


@pytest.mark.parametrize(("extra", "match"), [
    ({"session_tokens": 6000}, "option session_tokens is not read"),
    ({"functions": 4}, "option functions is not read"),
])
def test_options_that_do_not_apply_are_refused(extra: dict[str, object], match: str) -> None:
    with pytest.raises(EvalError, match=match) as err:
        get_task("agentic_bfcl", TaskOptions(extra=extra))
    assert "\n" not in str(err.value)


def test_a_context_too_small_for_the_docs_names_what_it_needs(tmp_path: Path) -> None:
    task = get_task("agentic_bfcl", TaskOptions(extra={"sessions": 2, "context_tokens": 2000}))
    with pytest.raises(EvalError, match=r"0 BFCL entries' function docs fit context_tokens 2000; 2 sessions need "
                                        r"context_tokens >= \d+"):
        task.items(shared_data_dir("gsm8k/test.jsonl"))
