"""BFCL's own decoder and AST checker, loaded from the installed bfcl-eval wheel, and a helper asserting that
evals.tasks.tool_calls agrees with them: ast_checker.py with its one heavy import (the model registry
bfcl_eval.constants.model_config, read only for dotted function names) replaced by an empty mapping, and
model_handler/utils.py's decoding functions with their source executed alone (the module imports tree-sitter
parsers for Java and JavaScript). Tests using the `bfcl` fixture skip where bfcl-eval is not installed."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evals.tasks.tool_calls import Call, check_calls, decode_calls


def load_bfcl() -> Iterator[tuple[Any, Any, Any]]:
    """(ast_checker module, Language, BFCL's default_decode_ast_prompting): the `bfcl` fixture (conftest.py)."""
    if importlib.util.find_spec("bfcl_eval") is None:
        pytest.skip("bfcl-eval is not installed (pip install --no-deps bfcl-eval==2026.3.23)")
    stub = types.ModuleType("bfcl_eval.constants.model_config")
    stub.MODEL_CONFIG_MAPPING = {}  # type: ignore[attr-defined]
    saved = sys.modules.get(stub.__name__)
    sys.modules[stub.__name__] = stub
    try:
        checker = importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
        enums = importlib.import_module("bfcl_eval.constants.enums")
    finally:
        if saved is None:
            sys.modules.pop(stub.__name__, None)
        else:
            sys.modules[stub.__name__] = saved
    source = Path(importlib.util.find_spec("bfcl_eval").origin).parent / "model_handler" / "utils.py"  # type: ignore[arg-type]
    tree = ast.parse(source.read_text(encoding="utf-8"))
    wanted = {"ast_parse", "resolve_ast_call", "resolve_ast_by_type", "default_decode_ast_prompting"}
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {f.name for f in funcs} == wanted
    namespace: dict[str, Any] = {"ast": ast, "re": re, "ReturnFormat": enums.ReturnFormat}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), str(source), "exec"), namespace)  # noqa: S102 - BFCL's code
    yield checker, enums.Language, namespace["default_decode_ast_prompting"]


def as_bfcl(calls: list[Call]) -> list[dict[str, Any]]:
    return [{c.name: dict(c.args)} for c in calls]


def bfcl_decode(decode: Any, text: str) -> list[dict[str, Any]] | None:
    try:
        out = decode(text)
    except Exception:  # noqa: BLE001 - BFCL raises whatever ast raises: not decoded
        return None
    return out if out and all(isinstance(c, dict) for c in out) else None


def same_verdict(bfcl: tuple[Any, Any, Any], docs: list[dict], text: str, answers: list[dict]) -> bool:
    """Assert our decode + check agrees with BFCL's on `text` (decoded calls, verdict, error type); the verdict."""
    checker, language, decode = bfcl
    ours = decode_calls(text)
    theirs = bfcl_decode(decode, text)
    assert (as_bfcl(ours) if ours is not None else None) == theirs, text
    if ours is None:
        return False
    mine = check_calls(docs, ours, answers)
    if len(answers) == 1:
        ref = (checker.simple_function_checker(docs[0], theirs[0], answers[0], language.PYTHON, "model")
               if len(theirs) == 1 else {"valid": False, "error_type": "simple_function_checker:wrong_count"})
    else:
        # its possible answers are one dict {name: params}: only turns whose calls have distinct names fit it
        merged = {k: v for a in answers for k, v in a.items()}
        assert len(merged) == len(answers), "parallel_function_checker_enforce_order needs distinct names"
        ref = checker.parallel_function_checker_enforce_order(docs, theirs, merged, language.PYTHON, "model")
    assert mine.correct == ref["valid"], (text, mine, ref)
    if not ref["valid"]:
        assert mine.error_type == ref["error_type"], (text, mine, ref)
    return mine.correct
