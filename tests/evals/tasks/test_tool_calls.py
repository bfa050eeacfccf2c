"""The tool-call decoder and AST checker against BFCL's own code, loaded from the installed bfcl-eval wheel:
ast_checker.py's simple_function_checker / parallel_function_checker_enforce_order (its one heavy import,
the model registry bfcl_eval.constants.model_config, replaced by an empty mapping: the checker reads it only
for dotted function names) and model_handler/utils.py's decoding functions (their source executed alone: the
module imports tree-sitter parsers for Java and JavaScript). Cases: hand-made ones for every rule, real
SmolLM2-135M completions of the agentic task, and every reference call of generated sessions with each
argument perturbed. Skipped where bfcl-eval is not installed (scripts/setup.sh --dev installs it)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from evals.tasks.tool_calls import (
    Call,
    check_call,
    check_calls,
    decode_calls,
    decode_first_span,
    render_calls,
)
from evals.tasks.tool_catalog import CATALOGUE, Draw, Fact
from tests.evals.tasks.bfcl_fixtures import same_verdict

DOC = {"name": "book", "description": "Book a thing.", "parameters": {"type": "dict", "properties": {
    "city": {"type": "string", "description": "city"},
    "guests": {"type": "integer", "description": "guests"},
    "price": {"type": "float", "description": "price"},
    "vip": {"type": "boolean", "description": "vip"},
    "names": {"type": "array", "items": {"type": "string"}, "description": "names"},
    "nums": {"type": "array", "items": {"type": "integer"}, "description": "nums"},
    "opts": {"type": "dict", "description": "options"},
    "rows": {"type": "array", "items": {"type": "dict"}, "description": "rows"},
}, "required": ["city", "guests"]}}
ANSWER = {"book": {"city": ["New York", "NYC"], "guests": [4], "price": [12.0, ""], "vip": [False, ""],
                   "names": [["Ana", "Raj"], ""], "nums": [[1, 2], ""], "opts": [{"a": [1], "b": ["x", ""]}, ""],
                   "rows": [[{"k": [1]}, {"k": [2]}], ""]}}
OUTPUTS = [
    "[book(city='New York', guests=4)]", "book(city='new-york', guests=4)", "[book(city='NYC', guests=4, price=12)]",
    "[book(city='NYC', guests=4, price=12.0, vip=False)]", "[book(city='Boston', guests=4)]",
    "[book(city='NYC')]", "[book(city='NYC', guests='4')]", "[book(city='NYC', guests=4.0)]",
    "[book(city='NYC', guests=True)]", "[book(city='NYC', guests=4, extra=1)]", "[booking(city='NYC', guests=4)]",
    "[book(city='NYC', guests=4, names=['ana', 'RAJ'])]", "[book(city='NYC', guests=4, names=['Raj', 'Ana'])]",
    "[book(city='NYC', guests=4, nums=[1, '2'])]", "[book(city='NYC', guests=4, nums=[1, 2])]",
    "[book(city='NYC', guests=4, opts={'a': 1})]", "[book(city='NYC', guests=4, opts={'a': 1, 'b': 'X'})]",
    "[book(city='NYC', guests=4, opts={'a': 2})]", "[book(city='NYC', guests=4, opts={'c': 1})]",
    "[book(city='NYC', guests=4, rows=[{'k': 1}, {'k': 2}])]", "[book(city='NYC', guests=4, rows=[{'k': 2}])]",
    "[book(city='NYC', guests=4, rows=[{'k': 1}, {'k': 3}])]", "[book(city='NYC', guests=4, rows=[])]",
    "[book(city='NYC', guests=4, nums=[])]", "[book(city='NYC', guests=4, opts={})]",
    "[book(city='NYC', guests=4, vip='False')]", "[book(city='NYC', guests=-4)]", "[book(guests=4, city=\"NYC\")]",
    "[book(city=NYC, guests=4)]", "[book(city='NYC', guests=4, names=[])]",
]
# Real completions of SmolLM2-135M-Instruct on the agentic task (fp32, greedy; the calls it was asked for:
# read_document(doc_id='doc-807'), send_message(recipient=..., text=...), search_notes(...), transfer_funds(...))
REAL = [
    " [open_document_doc_807]",
    " [send_message(phone_number='phone_number', user_name='user_name', user_email='user_email')]",
    " 5",
    " [transfer_document(account_id='mellow-canyon-81', account_number='53', account_type='account', account_name='li",
]


@pytest.mark.parametrize("text", OUTPUTS + REAL)
def test_every_rule_agrees_with_bfcl(bfcl: tuple[Any, Any, Any], text: str) -> None:
    same_verdict(bfcl, [DOC], text, [ANSWER])


def test_hand_computed_verdicts() -> None:
    def ok(text: str) -> bool:
        calls = decode_calls(text)
        return calls is not None and check_calls([DOC], calls, [ANSWER]).correct

    assert ok("[book(city='New York', guests=4)]") and ok("book(city='new-york', guests=4)")  # standardized
    assert ok("[book(city='NYC', guests=4, price=12)]")  # an int for a float
    assert not ok("[book(city='NYC', guests=4.0)]") and not ok("[book(city='NYC', guests=True)]")  # types
    assert not ok("[book(city='NYC')]")  # a required parameter missing
    assert not ok("[book(city='NYC', guests=4, names=['Raj', 'Ana'])]")  # lists keep their order
    assert ok("[book(city='NYC', guests=4, opts={'a': 1})]") and not ok("[book(city='NYC', guests=4, opts={'c': 1})]")
    assert ok("[book(city='NYC', guests=4, rows=[])]")  # BFCL's quirk: the optional marker "" admits []
    calls = decode_calls("[book(city='NYC', guests=4)]")
    assert calls is not None
    assert check_call(DOC, calls[0], {"book": {**ANSWER["book"], "price": [12.0]}}).error_type == (
        "simple_function_checker:missing_optional")


def test_real_completions_are_scored_as_bfcl_scores_them(bfcl: tuple[Any, Any, Any]) -> None:
    assert decode_calls(REAL[0]) is None  # a bare name in brackets is not a call
    calls = decode_calls(REAL[1])
    assert calls is not None and calls[0].name == "send_message" and "phone_number" in calls[0].args
    assert decode_calls(REAL[2]) is None and decode_calls(REAL[3]) is None  # a number; a call cut off at max_tokens


def test_arithmetic_is_never_evaluated_where_bfcl_would_eval_it(bfcl: tuple[Any, Any, Any]) -> None:
    _, _, decode = bfcl
    assert decode("[book(city='NYC', guests=2+2)]") == [{"book": {"city": "NYC", "guests": 4}}]  # BFCL eval()s it
    assert decode_calls("[book(city='NYC', guests=2+2)]") is None  # here: not parsed


def test_the_first_call_list_inside_prose_is_found() -> None:
    found = decode_first_span("Sure! Here it is: [book(city='NYC', guests=4)] and that is all.")
    assert found == [Call("book", {"city": "NYC", "guests": 4})]
    assert decode_first_span("no call here") is None
    assert render_calls(found) == "[book(city='NYC', guests=4)]"


def test_generated_reference_calls_pass_and_every_perturbed_argument_agrees_with_bfcl(
        bfcl: tuple[Any, Any, Any]) -> None:
    rng = random.Random(7)
    checked = 0
    for fn in CATALOGUE:
        for k in range(6):
            facts = [Fact(f"key-{k}-{j}", str(rng.randrange(10**6, 10**7))) for j in range(3)]
            turn = fn.draw(Draw(random.Random(f"{fn.doc['name']}/{k}"), facts, lambda: "some text"))
            assert same_verdict(bfcl, [fn.doc], turn.answer, list(turn.answers)), turn.answer
            call = turn.calls[0]
            for p, v in call.args.items():
                bad = (v + "x" if isinstance(v, str) else not v if isinstance(v, bool) else [*v, "zz"]
                       if isinstance(v, list) else v + 1)
                wrong = render_calls([Call(call.name, {**call.args, p: bad})])
                assert not same_verdict(bfcl, [fn.doc], wrong, list(turn.answers)), wrong
                checked += 1
    assert checked > 100


def test_several_calls_are_checked_in_order(bfcl: tuple[Any, Any, Any]) -> None:
    other = {"name": "pay", "description": "Pay.", "parameters": {"type": "dict", "properties": {
        "amount": {"type": "float", "description": "amount"}}, "required": ["amount"]}}
    answers = [ANSWER, {"pay": {"amount": [3.5]}}]
    assert same_verdict(bfcl, [DOC, other], "[book(city='NYC', guests=4), pay(amount=3.5)]", answers)
    assert not same_verdict(bfcl, [DOC, other], "[pay(amount=3.5), book(city='NYC', guests=4)]", answers)
    assert not same_verdict(bfcl, [DOC, other], "[book(city='NYC', guests=4)]", answers)
