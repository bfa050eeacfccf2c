"""Exceptions `evals` raises for bad user input or unusable resources (one-line CLI errors)."""


class EvalError(Exception):
    """Base of every user-facing error in `evals`: the message names the problem and the fix."""


class DataError(EvalError):
    """A dataset file is missing, truncated or has the wrong shape, or a name is unknown."""


class RecordError(EvalError):
    """A records file or run directory cannot be used (other spec, other schema, corrupt)."""


class ModelError(EvalError):
    """A model cannot be found or loaded."""


class EngineError(EvalError):
    """An engine cannot be built or cannot serve the requested kind of task."""


def one_line(exc: BaseException) -> str:
    """An exception's whole message on one line (transformers' validation errors span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name when the message is empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
