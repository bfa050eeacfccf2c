"""BFCL's multi-turn data as the tool-call turns of `agentic_bfcl`, read from the installed bfcl-eval wheel at
run time and never copied: bfcl_eval/data/BFCL_v4_multi_turn_base.json (each entry's user turns, initial
state, involved API classes, excluded functions), possible_answer/BFCL_v4_multi_turn_base.json (each turn's
ground-truth calls) and multi_turn_func_doc/*.json (the classes' function docs) (Patil et al., "The Berkeley
Function Calling Leaderboard (BFCL)", ICML 2025; bfcl-eval 2026.3.23, `pip install --no-deps`).

Per entry, turn by turn: the reference answer is the turn's ground-truth call list on one line; its result
is what BFCL's own executor (bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils.
execute_multi_turn_func_call, on the entry's initial state, state kept across the entry's turns) returns for
those calls, a JSON list of strings; the possible answer of each call (evals.tasks.tool_calls) holds its
ground-truth values, positional arguments named by the doc's parameter order, and admits leaving out any
other parameter (or giving its documented default). BFCL scores its multi-turn category by executing the
model's calls and comparing states and responses; matching the ground-truth calls by AST, in order, as done
here, is stricter (another call sequence reaching the same state fails), and is said so in the records'
task version. Nothing of BFCL's text goes into the repository or the reports: records hold the entry id.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from evals.errors import EvalError
from evals.tasks.tool_calls import Call, FunctionDoc, PossibleAnswer

BFCL_VERSION = "2026.3.23"  # the bfcl-eval release whose data and checker rules these tasks follow
INSTALL_HINT = f'pip install --no-deps "bfcl-eval=={BFCL_VERSION}" (scripts/setup.sh --dev does)'
QUESTIONS = "data/BFCL_v4_multi_turn_base.json"
GROUND_TRUTH = "data/possible_answer/BFCL_v4_multi_turn_base.json"
DOCS = "data/multi_turn_func_doc"
BACKEND = "bfcl_eval.constants.executable_backend_config"  # MULTI_TURN_FUNC_DOC_FILE_MAPPING: class -> doc file
EXECUTOR = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"
_runs = itertools.count()  # each build executes in fresh API instances (the executor keeps them in its globals)


@dataclass(frozen=True)
class BfclTurn:
    """One user turn of an entry: its request, ground-truth calls, their possible answers, the executor's result."""

    request: str
    calls: tuple[Call, ...]
    answers: tuple[PossibleAnswer, ...]
    answer: str  # the ground-truth call list, one line
    result: str  # JSON list of the executor's result strings


@dataclass(frozen=True)
class BfclEntry:
    """One multi-turn entry: its id, the docs of its classes' functions (excluded ones left out), its turns."""

    id: str
    docs: tuple[FunctionDoc, ...]
    turns: tuple[BfclTurn, ...]

    @property
    def doc_chars(self) -> int:
        """Characters of the docs as the context lists them (one JSON line each)."""
        return sum(len(json.dumps(d)) + 1 for d in self.docs)


def _package() -> Any:
    try:
        return resources.files("bfcl_eval")
    except ModuleNotFoundError:
        raise EvalError(f"agentic_bfcl: the bfcl-eval package is not installed; {INSTALL_HINT}") from None


def _jsonl(path: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _value(node: ast.expr) -> Any:
    return ast.literal_eval(node)


def ground_truth_call(text: str, doc: FunctionDoc) -> Call:
    """One ground-truth call string as a Call, positional arguments named in the doc's parameter order."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise EvalError(f"agentic_bfcl: ground truth {text[:40]!r} is not a plain call")
    names = list(doc["parameters"]["properties"])
    args = {names[i]: _value(a) for i, a in enumerate(node.args)}
    args.update({kw.arg: _value(kw.value) for kw in node.keywords if kw.arg is not None})
    return Call(node.func.id, args)


def _allowed(value: Any) -> Any:
    """A ground-truth value as BFCL's possible answers hold it: a dict's (and a list of dicts') values as lists."""
    if isinstance(value, dict):
        return {k: [v] for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_allowed(v) for v in value]
    return value


def possible_answer(call: Call, doc: FunctionDoc) -> PossibleAnswer:
    """{name: {param: [allowed]}}: the given values, and every other parameter optional (or its default)."""
    allowed: dict[str, list[Any]] = {p: [_allowed(v)] for p, v in call.args.items()}
    for p, spec in doc["parameters"]["properties"].items():
        if p not in allowed:
            allowed[p] = [spec["default"], ""] if "default" in spec and spec["default"] != "None" else [""]
    return {call.name: allowed}


def _render(calls: Sequence[Call]) -> str:
    return "[" + ", ".join(f"{c.name}(" + ", ".join(f"{k}={v!r}" for k, v in c.args.items()) + ")" for c in calls) + "]"


def load_entries(ids: Sequence[str] | None = None) -> list[BfclEntry]:
    """The multi-turn base entries (all, or those of `ids` in that order) with their executed results."""
    pkg = _package()
    questions = {q["id"]: q for q in _jsonl(pkg / QUESTIONS)}
    truth = {a["id"]: a["ground_truth"] for a in _jsonl(pkg / GROUND_TRUTH)}
    doc_files = importlib.import_module(BACKEND).MULTI_TURN_FUNC_DOC_FILE_MAPPING
    execute = importlib.import_module(EXECUTOR).execute_multi_turn_func_call
    wanted = list(ids) if ids is not None else list(questions)
    if unknown := [i for i in wanted if i not in questions]:
        raise EvalError(f"agentic_bfcl: no multi-turn base entry {unknown[0]!r} in bfcl-eval {BFCL_VERSION}")
    out = []
    for entry_id in wanted:
        q = questions[entry_id]
        excluded = set(q.get("excluded_function", []))
        docs = tuple(d for c in q["involved_classes"] for d in _jsonl(pkg / DOCS / doc_files[c])
                     if d["name"] not in excluded)
        by_name = {d["name"]: d for d in docs}
        run = f"qa_agentic_{next(_runs)}"
        turns = []
        for messages, gt in zip(q["question"], truth[entry_id], strict=True):
            calls = tuple(ground_truth_call(t, by_name[t.split("(", 1)[0].strip()]) for t in gt)
            results, _ = execute(list(gt), q["initial_config"], q["involved_classes"], run, entry_id)
            request = " ".join(m["content"] for m in messages if m.get("role") == "user")
            turns.append(BfclTurn(request, calls, tuple(possible_answer(c, by_name[c.name]) for c in calls),
                                  _render(calls), json.dumps(results)))
        _forget(execute, run)
        out.append(BfclEntry(entry_id, docs, tuple(turns)))
    return out


def _forget(execute: Any, run: str) -> None:
    """Drop the API instances the executor kept for `run` (in its module globals)."""
    scope: Mapping[str, Any] = execute.__globals__
    for name in [n for n in scope if n.startswith(run + "_")]:
        del execute.__globals__[name]
