"""Fixtures of the task tests: `bfcl`, BFCL's own decoder and checker from the installed wheel (bfcl_fixtures)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.evals.tasks.bfcl_fixtures import load_bfcl


@pytest.fixture(scope="module")
def bfcl() -> Iterator[tuple[Any, Any, Any]]:
    """(ast_checker module, Language, BFCL's default_decode_ast_prompting); skips without bfcl-eval."""
    yield from load_bfcl()
