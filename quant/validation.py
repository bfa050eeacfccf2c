"""Turn a pydantic ValidationError into the parts of a one-line error message (shared by every
module that validates user input: specs, policies, engine arguments, records, scales files)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import ValidationError


@dataclass(frozen=True)
class FirstError:
    """The first problem pydantic found: where (dotted key path), what, and how many more."""

    where: str  # "" when the problem is at the top level
    msg: str  # pydantic's message without its "Value error, " prefix
    type: str  # pydantic's error type, e.g. "extra_forbidden", "missing"
    input: object
    more: int  # further problems not shown

    def where_or(self, default: str) -> str:
        """The key path, or `default` when the problem is at the top level."""
        return self.where or default


def first_error(exc: ValidationError) -> FirstError:
    """The first of `exc`'s errors, ready for a one-line message."""
    errors = exc.errors()
    first = errors[0]
    return FirstError(
        where=".".join(str(p) for p in first["loc"]),
        msg=str(first["msg"]).removeprefix("Value error, "),
        type=str(first["type"]),
        input=first.get("input"),
        more=len(errors) - 1,
    )


def did_you_mean(key: str, known: Iterable[str], *, listing: str = "known keys", prefix: bool = False) -> str:
    """'did you mean 'x'?' for the closest known name, else '<listing>: a, b, c'. The one helper behind
    every "unknown name" error. `prefix`: names that start with `key` (case-insensitive) come first, and
    all of them are offered ('did you mean 'a' or 'b'?')."""
    names = list(known)
    close = [n for n in names if n.lower().startswith(key.lower())] if prefix and key else []
    close = close or difflib.get_close_matches(key, names, n=1, cutoff=0.5 if prefix else 0.6)
    if close:
        return f"did you mean {' or '.join(repr(n) for n in close)}?"
    return f"{listing}: {', '.join(names)}"
