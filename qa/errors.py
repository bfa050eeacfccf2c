"""Exceptions `qa` raises for bad user input; `USER_ERRORS` is what the CLI prints as one line."""

from evals.errors import EvalError
from quant.errors import QuantError


class QAError(Exception):
    """Base of every user-facing error in `qa`: the message names the problem and the fix."""


class PairingError(QAError):
    """Baseline and candidate records cannot be paired (different items or prompts)."""


class PolicyError(QAError):
    """A gate policy file is malformed."""


class SpecError(QAError):
    """A run spec is malformed."""


USER_ERRORS: tuple[type[Exception], ...] = (QAError, EvalError, QuantError)
