"""`needle`: synthetic long-context key-value retrieval (seeded), the probe where KV-cache
quantization errors show first: they accumulate with context length.

After RULER's single-needle task (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your
Long-Context Language Models?", arXiv:2404.06654): a fact "One of the special magic numbers for
{key} is: {value}." is hidden at a relative depth in filler text of a given length, optionally
with distractor facts for other keys, and the model is asked for the value. Score: exact match of
the first number in the completion with the value.

Everything comes from the task's own seed (option `seed`), not the run's: both arms see the same
haystacks. Lengths are in approximate tokens: the filler is sized by characters at
CHARS_PER_TOKEN, so the token count depends a little on the tokenizer. Item id
"L<length>-d<depth>-<n>"; cluster "L<length>-d<depth>" (items of a cell share length and depth).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.engines.base import GenerateResult
from evals.errors import EvalError
from evals.tasks.base import Item, Request, Result, Scored, TaskKind, TaskOptions
from evals.tasks.common import (
    GenSettings,
    check_options,
    gen_settings,
    generate_prompt,
    generate_request,
    int_option,
    probe_extra,
)
from evals.tasks.keys import adjective_noun_key

# Measured: the filler below averages 4.6 characters per SmolLM2 (GPT-2-style BPE) token; 4.5 errs
# toward shorter haystacks so a "7500-token" prompt stays inside an 8192-token window.
CHARS_PER_TOKEN = 4.5
DEFAULT_LENGTHS = (1000, 2000, 4000, 7500)
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_PER_CELL = 5
DEFAULT_SEED = 20240406  # RULER's arXiv date; any fixed value works, it only has to be the same in both arms
DEFAULT_MAX_TOKENS = 16
UNTIL = ("\n",)
OPTION_KEYS = ("lengths", "depths", "per_cell", "distractors", "seed")

INSTRUCTION = ("Some special magic numbers are hidden within the following text. Make sure to memorize them. "
               "I will quiz you about the numbers afterwards.\n")
NEEDLE = "One of the special magic numbers for {key} is: {value}."
QUESTION = ("\nWhat is the special magic number for {key} mentioned in the provided text? "
            "The special magic number for {key} mentioned in the provided text is")
NUMBER_RE = re.compile(r"\d+")

FILLER = (
    "The grass is green and the sky is blue.",
    "A river runs past the old mill at the edge of the village.",
    "Most mornings the market opens before the sun is fully up.",
    "The library keeps its maps in a cabinet near the window.",
    "Trains leave the station every twenty minutes on weekdays.",
    "In autumn the leaves on the hill turn red and gold.",
    "The baker sells bread, rolls and a few kinds of cake.",
    "Children walk to school along the path beside the canal.",
    "A small boat is tied to the pier at the end of the lane.",
    "The museum shows tools that farmers used long ago.",
    "Clouds gather over the mountains in the late afternoon.",
    "The town hall clock has been repaired several times.",
    "Fresh vegetables arrive at the shop on Tuesdays and Fridays.",
    "A narrow bridge crosses the stream below the church.",
    "The garden behind the house is full of roses in June.",
    "Visitors often stop at the café for tea and a sandwich.",
    "The road to the coast winds through fields and forests.",
    "Snow rarely falls in the valley, but the peaks stay white.",
    "The post office closes early on Saturdays.",
    "An old stone wall marks the border of the farm.",
)
def _key(rng: random.Random, taken: set[str]) -> str:
    return adjective_noun_key(rng, taken, exhausted="needle: ran out of distinct keys; ask for fewer needles")


def _value(rng: random.Random) -> str:
    return str(rng.randrange(1_000_000, 10_000_000))  # 7 digits, as RULER's numeric values


def haystack(rng: random.Random, n_chars: int) -> list[str]:
    """Filler sentences totalling about n_chars characters (joined by single spaces)."""
    out: list[str] = []
    size = 0
    while size < n_chars:
        s = rng.choice(FILLER)
        out.append(s)
        size += len(s) + 1
    return out


def make_context(rng: random.Random, length: int, depth: float, needles: Sequence[tuple[str, float]]) -> str:
    """Filler of ~length tokens with each (sentence, depth) inserted at that relative sentence position."""
    sentences = haystack(rng, int(length * CHARS_PER_TOKEN) - len(INSTRUCTION) - 200)
    for text, d in sorted(needles, key=lambda nd: nd[1], reverse=True):
        sentences.insert(round(d * len(sentences)), text)
    return " ".join(sentences)


def first_number(completion: str) -> str | None:
    """The first run of digits in the completion, or None."""
    m = NUMBER_RE.search(completion)
    return m.group(0) if m else None


DEFAULT_SETTINGS = GenSettings(until=UNTIL, max_tokens=DEFAULT_MAX_TOKENS)


@dataclass(frozen=True)
class NeedleTask:
    """Key-value retrieval at several context lengths and depths."""

    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    depths: tuple[float, ...] = DEFAULT_DEPTHS
    per_cell: int = DEFAULT_PER_CELL
    distractors: int = 0
    seed: int = DEFAULT_SEED
    settings: GenSettings = DEFAULT_SETTINGS
    think_tags: tuple[str, str] | None = None
    name: str = "needle"
    version: str = "1"
    kind: TaskKind = "generate"

    def items(self, data_dir: Path | None) -> list[Item]:
        """lengths x depths x per_cell haystacks, each from its own seeded generator (data_dir unused)."""
        items = []
        for length in self.lengths:
            for depth in self.depths:
                cell = f"L{length}-d{depth:.2f}"
                for n in range(self.per_cell):
                    rng = random.Random(f"{self.seed}/{cell}/{n}")
                    taken: set[str] = set()
                    key, value = _key(rng, taken), _value(rng)
                    needles = [(NEEDLE.format(key=key, value=value), depth)]
                    for _ in range(self.distractors):
                        needles.append((NEEDLE.format(key=_key(rng, taken), value=_value(rng)), rng.random()))
                    context = make_context(rng, length, depth, needles)
                    items.append(Item(item_id=f"{cell}-{n}", cluster=cell,
                                      doc={"context": context, "key": key, "value": value,
                                           "length": length, "depth": depth}))
        return items

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """Instruction + haystack + question; generate a short answer until a newline."""
        prompt = INSTRUCTION + item.doc["context"] + QUESTION.format(key=item.doc["key"])
        return generate_request(prompt, self.settings, seed)

    def prompt_text(self, request: Request) -> str:
        """The whole prompt."""
        return generate_prompt(request)

    def reference(self, item: Item) -> str:
        """The hidden value, as the continuation of "... mentioned in the provided text is"."""
        return " " + item.doc["value"]

    def score(self, item: Item, result: Result) -> Scored:
        """exact_match of the completion's first number with the hidden value."""
        assert isinstance(result, GenerateResult)
        value = item.doc["value"]
        got = first_number(result.text)
        return Scored(scores={"exact_match,first-number": float(got == value)},
                      extracted={"first-number": got}, target=value)


def _ints(extra: Mapping[str, Any], key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    value = extra.get(key, default)
    if (not isinstance(value, list | tuple) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 64 for v in value)):
        raise EvalError(f"needle: option {key} must be a non-empty list of token lengths >= 64, got {value!r}")
    return tuple(value)


def _fractions(extra: Mapping[str, Any], key: str, default: tuple[float, ...]) -> tuple[float, ...]:
    value = extra.get(key, default)
    if (not isinstance(value, list | tuple) or not value
            or not all(isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1 for v in value)):
        raise EvalError(f"needle: option {key} must be a non-empty list of depths in [0, 1], got {value!r}")
    return tuple(float(v) for v in value)


CHATS = False  # this probe's prompt is a raw haystack (build refuses chat = true)


def build(name: str, options: TaskOptions, template: object = None) -> NeedleTask:
    """The probe with its options: lengths, depths, per_cell, distractors, seed (in `options.extra`)."""
    extra = probe_extra("needle", options, OPTION_KEYS, "zero-shot retrieval")
    check_options(name, options, generates=True, extra=True,
                  chats="the probe's prompt is a raw haystack, not an lm-eval prompt")
    return NeedleTask(
        lengths=_ints(extra, "lengths", DEFAULT_LENGTHS),
        depths=_fractions(extra, "depths", DEFAULT_DEPTHS),
        per_cell=int_option("needle", extra, "per_cell", DEFAULT_PER_CELL, 1),
        distractors=int_option("needle", extra, "distractors", 0, 0),
        seed=int_option("needle", extra, "seed", DEFAULT_SEED, 0),
        settings=gen_settings(options, UNTIL, DEFAULT_MAX_TOKENS),
        think_tags=options.think_tags,
    )
