"""Tool calls: decode a completion into function calls and check them against the expected calls by the
rules of BFCL's AST checker (Patil et al., "The Berkeley Function Calling Leaderboard (BFCL): From Tool Use to
Agentic Evaluation of Large Language Models", ICML 2025), Python rules only.

Read from bfcl-eval 2026.3.23 (the PyPI wheel), and followed here:
- decoding, `bfcl_eval/model_handler/utils.py`: `default_decode_ast_prompting` strips "`", newlines and
  spaces, wraps the text in [ ] when it lacks them, `ast_parse` parses it as one Python expression (a call
  or a list of calls) and `resolve_ast_call` keeps each call's dotted name and its KEYWORD arguments
  (positional arguments are dropped, as there); `resolve_ast_by_type` turns argument values into Python
  values. One deliberate difference: BFCL `eval()`s an arithmetic (BinOp) or lambda argument; this module
  never evaluates model output, so such a call does not decode (it counts as not parsed).
- checking, `bfcl_eval/eval_checker/ast_eval/ast_checker.py`: `simple_function_checker` (the name must
  match; every required parameter present; every given parameter documented and in the possible answer;
  its type the documented one, an int accepted for a float, lists checked one level deep; strings,
  lists of strings and dict values compared after `standardize_string`; other values must be among the
  allowed ones; a parameter left out must allow "" (optional)), `parallel_function_checker_enforce_order`
  (several expected calls, in order) and `type_checker`'s "variable" case (a value whose type is that of
  the possible answers' is accepted as a variable reference).

A possible answer is BFCL's shape: {function name: {parameter: [allowed values]}}, "" among the values
meaning the parameter may be left out. Function docs are BFCL's shape too: {"name", "description",
"parameters": {"type": "dict", "properties": {name: {"type", "description", ...}}, "required": [...]}}.
tests/evals/tasks/test_tool_calls.py checks these functions against BFCL's own, loaded from the wheel.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FunctionDoc = Mapping[str, Any]
PossibleAnswer = Mapping[str, Mapping[str, Sequence[Any]]]  # {name: {param: [allowed values]}}
PYTHON_TYPES: dict[str, type] = {  # ast_checker.PYTHON_TYPE_MAPPING
    "string": str, "integer": int, "float": float, "boolean": bool, "array": list, "tuple": list, "dict": dict,
    "any": str,
}
NESTED_TYPES = ("array", "tuple")  # ast_checker.PYTHON_NESTED_TYPE_CHECK_LIST
STANDARDIZE_RE = re.compile(r"[ \,\.\/\-\_\*\^]")  # ast_checker.standardize_string
CALL_SPAN_RE = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(.*\)\s*\]", re.DOTALL)  # a bracketed call list inside text


@dataclass(frozen=True)
class Call:
    """One decoded call: its (dotted) name and keyword arguments."""

    name: str
    args: Mapping[str, Any]


@dataclass(frozen=True)
class CallCheck:
    """The BFCL checker's verdict on decoded calls: correct or not, BFCL's error type ("" when correct) and
    one line of detail."""

    correct: bool
    error_type: str = ""
    detail: str = ""


class _Unsupported(ValueError):
    """An argument value this decoder does not turn into a value (BFCL would evaluate or refuse it)."""


def _value(node: ast.expr) -> Any:
    """resolve_ast_by_type, without evaluating anything."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        if isinstance(node.operand.value, int | float) and not isinstance(node.operand.value, bool):
            return -node.operand.value
        raise _Unsupported("a unary minus on a non-number")
    if isinstance(node, ast.List):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(v) for v in node.elts)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _Unsupported("a ** expansion in a dict")
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        if not node.keywords:
            return ast.unparse(node)
        call = _call(node)
        return {call.name: dict(call.args)}
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value) + "[" + ast.unparse(node.slice) + "]"
    raise _Unsupported(f"an argument of type {type(node).__name__}")


def _call(node: ast.Call) -> Call:
    """resolve_ast_call: the dotted name and the keyword arguments (positional ones dropped, as in BFCL)."""
    parts: list[str] = []
    func: ast.expr = node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    args = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise _Unsupported("a ** expansion")
        args[kw.arg] = _value(kw.value)
    return Call(".".join(reversed(parts)), args)


def decode_calls(text: str) -> list[Call] | None:
    """default_decode_ast_prompting on `text`: the calls it holds, None when it does not decode."""
    body = text.strip("`\n ")
    if not body.startswith("["):
        body = "[" + body
    if not body.endswith("]"):
        body = body + "]"
    try:
        tree = ast.parse(body.strip().strip("'"), mode="eval").body
        if isinstance(tree, ast.Call):
            return [_call(tree)]
        elts = getattr(tree, "elts", None)
        if elts is None or not all(isinstance(e, ast.Call) for e in elts):
            return None
        return [_call(e) for e in elts]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def decode_first_span(text: str) -> list[Call] | None:
    """The calls of the first bracketed call list found anywhere in `text` (leading prose allowed), else None."""
    for m in CALL_SPAN_RE.finditer(text):
        calls = decode_calls(m.group(0))
        if calls:
            return calls
    return None


def standardize_string(s: str) -> str:
    """ast_checker.standardize_string: spaces and ,./-_*^ removed, lower case, ' -> \"."""
    return STANDARDIZE_RE.sub("", s).lower().replace("'", '"')


def _std(v: Any) -> Any:
    return standardize_string(v) if isinstance(v, str) else v


def _answer_type(allowed: Sequence[Any]) -> type | None:
    """get_possible_answer_type: the type of the first allowed value that is not "" (optional)."""
    return next((type(a) for a in allowed if a != ""), None)


def _type_ok(value: Any, allowed: Sequence[Any], expected: type, nested: type | None) -> tuple[bool, bool]:
    """type_checker: (valid, is_variable). As there, an allowed item that is not a list (e.g. "", optional)
    passes the nested check of a list value, and a failed nested check is invalid whatever follows."""
    answer_type = _answer_type(allowed)
    is_variable = answer_type is not None and answer_type != expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for item in allowed:
            if type(item) is not list or all(_type_ok(v, item, nested, None)[0] for v in value):
                return True, is_variable
        return False, False
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, False


def _dict_check(value: Mapping[Any, Any], allowed: Sequence[Any]) -> str:
    """dict_checker: "" when some allowed dict admits every key and value of `value` and misses no required
    key, else the error type of the last allowed dict tried (BFCL's)."""
    error = "dict_checker:unclear"
    for answer in allowed:
        if answer == "":
            continue
        error = ""
        for k, v in value.items():
            if k not in answer:
                error = "value_error:dict_key"
                break
            if _std(v) not in [_std(a) for a in answer[k]]:
                error = "value_error:dict_value"
                break
        if any(k not in value and "" not in vals for k, vals in answer.items()):
            error = "value_error:dict_key"
        if not error:
            return ""
    return error


def _list_dict_check(value: Sequence[Any], allowed: Sequence[Any]) -> str:
    """list_dict_checker: "" when some allowed list of dicts matches `value` dict by dict, in order, else the
    error type of the last one tried (as there, the optional marker "" has length 0: it admits an empty list)."""
    error = "list_dict_checker:unclear"
    for answer in allowed:
        if len(value) != len(answer):
            error = "value_error:list_dict_count"
            continue
        error = ""
        for v, a in zip(value, answer, strict=True):
            error = _dict_check(v, [a]) if isinstance(v, dict) else "value_error:dict_key"
            if error:
                break
        if not error:
            return ""
    return error


def check_call(doc: FunctionDoc, call: Call, answer: PossibleAnswer) -> CallCheck:
    """simple_function_checker (Python): one decoded call against one expected {name: {param: [allowed]}}."""
    name, allowed_args = next(iter(answer.items()))
    params = doc["parameters"]["properties"]
    if call.name != doc["name"] or name != doc["name"]:
        return CallCheck(False, "simple_function_checker:wrong_func_name",
                         f"expected {doc['name']}, got {call.name}")
    for p in doc["parameters"].get("required", []):
        if p not in call.args:
            return CallCheck(False, "simple_function_checker:missing_required",
                             f"missing required parameter {p}")
    for p, value in call.args.items():
        if p not in params or p not in allowed_args:
            return CallCheck(False, "simple_function_checker:unexpected_param", f"unexpected parameter {p}")
        declared = params[p]["type"]
        expected = PYTHON_TYPES.get(declared)
        if expected is None:
            return CallCheck(False, "type_error:simple", f"parameter {p}: unknown type {declared!r}")
        nested = PYTHON_TYPES.get(params[p].get("items", {}).get("type", "")) if declared in NESTED_TYPES else None
        if declared == "tuple" and type(value) is tuple:
            value = list(value)
        if declared == "float" and type(value) is int:
            value = float(value)  # Python's int -> float, as BFCL allows
        allowed = allowed_args[p]
        valid, variable = _type_ok(value, allowed, expected, nested)
        if not valid:
            return CallCheck(False, "type_error:nested" if nested is not None and type(value) is expected
                             else "type_error:simple", f"parameter {p}: expected {declared}, got {type(value).__name__}")
        if not variable:
            if expected is dict:
                if error := _dict_check(value, allowed):
                    return CallCheck(False, error, f"parameter {p}: {value!r} not allowed")
                continue
            if expected is list and nested is dict:
                if error := _list_dict_check(value, allowed):
                    return CallCheck(False, error, f"parameter {p}: {value!r} not allowed")
                continue
            if expected is str:
                if standardize_string(value) not in [standardize_string(a) for a in allowed if isinstance(a, str)]:
                    return CallCheck(False, "value_error:string", f"parameter {p}: {value!r} not allowed")
                continue
            if expected is list:
                # list_checker: as there, a string item of the allowed values is read character by character
                if [_std(v) for v in value] not in [[_std(a) for a in ans] for ans in allowed if isinstance(ans, list | str)]:
                    return CallCheck(False, "value_error:list/tuple", f"parameter {p}: {value!r} not allowed")
                continue
        if value not in allowed:
            return CallCheck(False, "value_error:others", f"parameter {p}: {value!r} not allowed")
    for p, allowed in allowed_args.items():
        if p not in call.args and "" not in allowed:
            return CallCheck(False, "simple_function_checker:missing_optional", f"parameter {p} not given")
    return CallCheck(True)


def check_calls(docs: Sequence[FunctionDoc], calls: Sequence[Call],
                answers: Sequence[PossibleAnswer]) -> CallCheck:
    """parallel_function_checker_enforce_order: as many calls as expected, each checked against its own, in
    order (one expected call: simple_function_checker's count rule)."""
    if len(calls) != len(answers):
        return CallCheck(False, "simple_function_checker:wrong_count" if len(answers) == 1 else
                         "parallel_function_checker_enforce_order:wrong_count",
                         f"{len(calls)} calls, expected {len(answers)}")
    by_name = {d["name"]: d for d in docs}
    for call, answer in zip(calls, answers, strict=True):
        name = next(iter(answer))
        if name not in by_name:
            return CallCheck(False, "simple_function_checker:wrong_func_name", f"{name} is not documented")
        result = check_call(by_name[name], call, answer)
        if not result.correct:
            return result
    return CallCheck(True)


def render_call(call: Call) -> str:
    """A call as the Python text a model writes, keyword arguments in the given order: name(a=1, b='x')."""
    return f"{call.name}(" + ", ".join(f"{k}={v!r}" for k, v in call.args.items()) + ")"


def render_calls(calls: Sequence[Call]) -> str:
    """A call list as one line: [f(a=1), g(b='x')] (what decode_calls reads back)."""
    return "[" + ", ".join(render_call(c) for c in calls) + "]"
