"""Seeded adjective-noun keys ("amber-falcon", or "amber-falcon-42" numbered), distinct within a context: the
needles of `needle` and `ruler` and the facts of `sessions`."""

from __future__ import annotations

import random

from evals.errors import EvalError

ADJECTIVES = ("quiet", "amber", "brisk", "hollow", "silver", "gentle", "rapid", "distant", "velvet", "crimson",
              "frozen", "golden", "humble", "little", "mellow", "noble", "polished", "rustic", "sturdy", "tidy")
NOUNS = ("lantern", "harbor", "meadow", "violin", "compass", "orchard", "falcon", "pebble", "canyon", "ledger",
         "thimble", "glacier", "kettle", "monsoon", "parcel", "quarry", "saddle", "trellis", "walnut", "zephyr")
MAX_TRIES = 10_000  # draws before giving up: far more than a context whose keys fit in the name space needs


def adjective_noun_key(rng: random.Random, taken: set[str], *, numbered: bool = False, exhausted: str) -> str:
    """A key not in `taken` (added to it): rng draws an adjective, a noun and, when `numbered`, a two-digit
    number, until the key is new; EvalError(`exhausted`) after MAX_TRIES draws."""
    for _ in range(MAX_TRIES):
        key = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
        if numbered:
            key += f"-{rng.randrange(10, 100)}"
        if key not in taken:
            taken.add(key)
            return key
    raise EvalError(exhausted)
