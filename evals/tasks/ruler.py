"""`ruler`: RULER-style synthetic retrieval at several context lengths, generated offline and seeded.

After RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?",
arXiv:2404.06654), whose definitions were read from github.com/NVIDIA/RULER at c3f5e3b: scripts/synthetic.yaml
(the task configurations), scripts/data/synthetic/niah.py and variable_tracking.py (generation),
scripts/data/synthetic/constants.py (templates, answer prefixes, tokens to generate) and
scripts/eval/synthetic/constants.py (string_match_all). Subtasks:
- "niah_single" (RULER's niah_single_2): one needle "One of the special magic numbers for {key} is: {value}."
  in an essay haystack; key an adjective-noun word, value a 7-digit number.
- "niah_multikey" (niah_multikey_1): four needles with four keys, one value each; one key is asked.
- "niah_multivalue" (niah_multivalue): four needles with the same key and four values; all are asked.
- "vt" (vt): variable tracking, one chain of 4 hops ("VAR ABCDE = 12345", "VAR FGHIJ = VAR ABCDE ", ...)
  spread over the noise haystack, one sentence a line; the five variables holding the value are asked.
Differences from RULER: the essay haystack is WikiText-2's test text (evals.data "wikitext2", read at run
time, its ASCII prose paragraphs) instead of Paul Graham's essays, split into sentences at ". " rather than
by nltk; needle depths are
drawn, as in RULER, from its 40 evenly spaced depths; and lengths are met by characters at a measured
tokenizer-free token count (approx_tokens, CHARS_PER_TOKEN) rather than by RULER's binary search with the
model's tokenizer, erring short: `length` is RULER's max_seq_length, prompt plus the generation budget
(measured over 60 items per length, prompt + budget / length: SmolLM2 0.81-1.06 at 2K, 0.84-0.97 at 8K,
0.86-0.97 at 16K; Gemma-3 0.80-1.04 at 2K, at most 0.97 from 4K on).

The prompt is RULER's template with its answer prefix appended (how RULER prompts a base model); scores are
RULER's string_match_all per item, "string_match_all,none" (the share of expected values found in the
completion, case-insensitive, after RULER's postprocess_pred), and "all_present,none" (1 when every expected
value is found). Item id "{subtask}/L{length}/{n}", no cluster (each item is its own haystack); meta
"subtask", "length". The reference answer is the expected values joined as RULER lists them.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals import data
from evals.engines.base import GenerateResult
from evals.errors import EvalError
from evals.tasks.agentic_text import haystack_lines
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

SUBTASKS = ("niah_single", "niah_multikey", "niah_multivalue", "vt")
DEFAULT_LENGTHS = (2048, 4096, 8192)  # add 16384 for a model with a longer window (Gemma-3-270M: 32768)
DEFAULT_PER_CELL = 10
DEFAULT_SEED = 20240409  # any fixed value; the same in both arms
OPTION_KEYS = ("subtasks", "lengths", "per_cell", "seed")
MIN_LENGTH = 256
# characters per token, measured with the SmolLM2 and Gemma-3 tokenizers: the noise lines 3.6 on both (less 3%);
# the templates read as English prose (4), needles and chains hold digits and codes (2)
CHARS_PER_TOKEN = {"noise": 3.6 * 0.97, "prose": 4.0, "needle": 2.0}
PROSE_WORDS = 40
WORD_RE, DIGIT_RE, PUNCT_RE = re.compile(r"[A-Za-z]+"), re.compile(r"\d"), re.compile(r"[!-/:-@\[-`{-~]")
TOKEN_WEIGHTS = {"word": 1.0, "letter_over_6": 0.2, "digit": 1.2, "punct": 1.2}  # least squares, rounded
ESSAY_FILL = 0.9  # the haystack fills this share of the room left (approx_tokens' upper tail, see above)
DEPTHS = tuple(round(100 * i / 39) for i in range(40))  # np.round(np.linspace(0, 100, 40)), RULER's DEPTHS
NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NIAH_TEMPLATE = ("Some special magic {type_v} are hidden within the following text. Make sure to memorize it. I will "
                 "quiz you about the {type_v} afterwards.\n{context}\nWhat are all the special magic {type_v} for "
                 "{query} mentioned in the provided text?")
NIAH_PREFIX = " The special magic {type_v} for {query} mentioned in the provided text are"
VT_TEMPLATE = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
               "Question: Find all variables that are assigned the value {query} in the text above.")
VT_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
             "assigned the value {query}, they are: ")
TOKENS_TO_GENERATE = {"niah": 128, "vt": 30}  # RULER's tokens_to_generate
VT_HOPS = 4
NIAH_COUNTS = {"niah_single": (1, 1), "niah_multikey": (4, 1), "niah_multivalue": (1, 4)}  # (keys, values per key)
SENTENCE_RE = re.compile(r"(?<=[.!?])\s+")
NON_PRINTABLE_RE = re.compile(r"[\x00-\x1f]")  # RULER's postprocess_pred


def postprocess(pred: str) -> str:
    """RULER's postprocess_pred: strip, control characters to newlines, strip."""
    return NON_PRINTABLE_RE.sub("\n", pred.strip()).strip()


def string_match_all(pred: str, refs: Sequence[str]) -> float:
    """RULER's string_match_all for one item: the share of references found in the prediction (lower case)."""
    low = pred.lower()
    return sum(r.lower() in low for r in refs) / len(refs)


def _number(rng: random.Random) -> str:
    return str(rng.randint(10**6, 10**7 - 1))  # generate_random_number(7)


def prose_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """WikiText-2's paragraphs of running prose: ASCII lines of at least PROSE_WORDS words (headings, tables,
    lists and non-Latin names tokenize at very different rates, so a length in tokens would drift)."""
    return [ln for ln in haystack_lines(rows) if ln.isascii() and len(ln.split()) >= PROSE_WORDS]


def approx_tokens(text: str) -> float:
    """A tokenizer-free token count of English prose: TOKEN_WEIGHTS per word, per letter of a word beyond its
    sixth, per digit and per punctuation mark (fitted by least squares on 3-paragraph windows of WikiText-2
    prose with the SmolLM2 and Gemma-3 tokenizers: true / approximate count median 1.00 and 0.96, 1st-99th
    percentiles 0.88-1.13 and 0.86-1.07; long rare words, e.g. taxonomic names, make the upper tail)."""
    words = WORD_RE.findall(text)
    return (TOKEN_WEIGHTS["word"] * len(words) + TOKEN_WEIGHTS["letter_over_6"] * sum(max(0, len(w) - 6) for w in words)
            + TOKEN_WEIGHTS["digit"] * len(DIGIT_RE.findall(text)) + TOKEN_WEIGHTS["punct"] * len(PUNCT_RE.findall(text)))


def essay_sentences(lines: Sequence[str], rng: random.Random, n_tokens: float) -> list[str]:
    """Consecutive WikiText-2 prose sentences from a seeded start, about n_tokens tokens (approx_tokens)."""
    out, size, i = [], 0.0, rng.randrange(len(lines))
    while size < n_tokens:
        for s in SENTENCE_RE.split(lines[i % len(lines)]):
            out.append(s)
            size += approx_tokens(s)
        i += 1
    return out


def insert_at_depths(sentences: list[str], needles: Sequence[str], rng: random.Random) -> str:
    """niah.py's essay insertion: needles after the sentences at RULER depths sampled without replacement."""
    cuts = [0, *sorted(int(len(sentences) * d / 100) for d in rng.sample(DEPTHS, len(needles))), len(sentences)]
    parts = []
    for i in range(1, len(cuts)):
        parts.append(" ".join(sentences[cuts[i - 1]:cuts[i]]))
        if i - 1 < len(needles):
            parts.append(needles[i - 1])
    return " ".join(p for p in parts if p)


@dataclass(frozen=True)
class RulerTask:
    """RULER-style retrieval: subtasks x lengths x per_cell seeded haystacks."""

    subtasks: tuple[str, ...] = SUBTASKS
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    per_cell: int = DEFAULT_PER_CELL
    seed: int = DEFAULT_SEED
    settings: Mapping[str, GenSettings] | None = None  # "niah" / "vt"; None: RULER's budgets
    think_tags: tuple[str, str] | None = None
    name: str = "ruler"
    version: str = "1+ruler-c3f5e3b"  # this toolkit's revision + the RULER commit whose definitions it follows
    kind: TaskKind = "generate"

    def _settings(self, subtask: str) -> GenSettings:
        family = "vt" if subtask == "vt" else "niah"
        return (self.settings or {k: GenSettings(until=(), max_tokens=v) for k, v in TOKENS_TO_GENERATE.items()})[family]

    def _niah(self, rng: random.Random, subtask: str, length: int, lines: Sequence[str]) -> tuple[str, list[str]]:
        n_keys, n_values = NIAH_COUNTS[subtask]
        type_v = "numbers"
        taken: set[str] = set()
        keys = [adjective_noun_key(rng, taken, exhausted="ruler: ran out of distinct keys") for _ in range(n_keys)]
        values = [[_number(rng) for _ in range(n_values)] for _ in keys]
        needles = [NEEDLE.format(type_v=type_v, key=k, value=v) for k, vs in zip(keys, values, strict=True) for v in vs]
        rng.shuffle(needles)
        asked = rng.randrange(n_keys)
        query, answers = keys[asked], values[asked]
        template, prefix = NIAH_TEMPLATE, NIAH_PREFIX
        if n_values == 1:  # niah.py: one query with one value reads in the singular
            template = template.replace("Some", "A").replace("are all", "is").replace("are", "is")
            prefix = prefix.replace("are", "is")
            type_v = type_v[:-1]
        fixed = (len(template) + len(prefix) + 2 * len(query)) / CHARS_PER_TOKEN["prose"] + sum(
            map(len, needles)) / CHARS_PER_TOKEN["needle"]  # tokens
        budget = (length - self._settings(subtask).max_tokens - fixed) * ESSAY_FILL
        context = insert_at_depths(essay_sentences(lines, rng, max(budget, 0)), needles, rng)
        prompt = (template.format(type_v=type_v, context=context, query=query)
                  + prefix.format(type_v=type_v, query=query))
        return prompt, answers

    def _vt(self, rng: random.Random, length: int) -> tuple[str, list[str]]:
        names: list[str] = []
        while len(set(names)) < VT_HOPS + 1:
            names.append("".join(rng.choices(string.ascii_uppercase, k=5)))
        names = list(dict.fromkeys(names))[: VT_HOPS + 1]
        value = str(rng.randint(10000, 99999))
        chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(VT_HOPS)]
        fixed = (len(VT_TEMPLATE) + len(VT_PREFIX)) / CHARS_PER_TOKEN["prose"] + sum(
            len(c) + 1 for c in chain) / CHARS_PER_TOKEN["needle"]  # tokens
        budget = int((length - self._settings("vt").max_tokens - fixed) * CHARS_PER_TOKEN["noise"])
        sentences = [NOISE] * max(1, budget // (len(NOISE) + 1))
        positions = sorted(rng.sample(range(len(sentences)), len(chain)))
        for j, (pos, line) in enumerate(zip(positions, chain, strict=True)):
            sentences.insert(pos + j, line)
        context = "\n".join(sentences).replace(". \n", ".\n")
        prompt = VT_TEMPLATE.format(context=context, query=value) + VT_PREFIX.format(num_v=VT_HOPS + 1, query=value)
        return prompt, names

    def items(self, data_dir: Path | None) -> list[Item]:
        """subtasks x lengths x per_cell items, each from its own seeded generator."""
        lines = prose_lines(data.load("wikitext2", data_dir, "test")) if set(self.subtasks) - {"vt"} else []
        items = []
        for subtask in self.subtasks:
            for length in self.lengths:
                for n in range(self.per_cell):
                    rng = random.Random(f"{self.seed}/{subtask}/{length}/{n}")
                    prompt, answers = (self._vt(rng, length) if subtask == "vt"
                                       else self._niah(rng, subtask, length, lines))
                    items.append(Item(item_id=f"{subtask}/L{length}/{n}", doc={
                        "subtask": subtask, "length": length, "prompt": prompt, "outputs": answers}))
        return items

    def plan_note(self) -> str:
        """What the task runs, one line (the power plan shows it)."""
        per_length = len(self.subtasks) * self.per_cell
        return (f"{', '.join(self.subtasks)} x lengths {', '.join(map(str, self.lengths))} x {self.per_cell}: "
                f"{per_length} items per length, whose effects are reported beside the verdict, not gated")

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """RULER's prompt with its answer prefix; generate the subtask's budget."""
        return generate_request(item.doc["prompt"], self._settings(item.doc["subtask"]), seed)

    def prompt_text(self, request: Request) -> str:
        """The whole prompt."""
        return generate_prompt(request)

    def reference(self, item: Item) -> str:
        """The expected values after the answer prefix: " a, b and c" (niah) / "A B C D E" (vt, after its colon)."""
        outs = item.doc["outputs"]
        if item.doc["subtask"] == "vt":
            return " ".join(outs)
        return " " + (outs[0] if len(outs) == 1 else ", ".join(outs[:-1]) + " and " + outs[-1]) + "."

    def score(self, item: Item, result: Result) -> Scored:
        """string_match_all (RULER's) and all_present over the expected values."""
        assert isinstance(result, GenerateResult)
        pred, outs = postprocess(result.text), item.doc["outputs"]
        share = string_match_all(pred, outs)
        return Scored(scores={"string_match_all,none": share, "all_present,none": float(share == 1.0)},
                      extracted={"none": pred}, target=", ".join(outs),
                      meta={"subtask": item.doc["subtask"], "length": item.doc["length"]})


def _lengths(extra: Mapping[str, Any]) -> tuple[int, ...]:
    value = extra.get("lengths", DEFAULT_LENGTHS)
    if (not isinstance(value, list | tuple) or not value or len(set(value)) != len(value)
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= MIN_LENGTH for v in value)):
        raise EvalError(f"ruler: option lengths must be a non-empty list of distinct token lengths >= {MIN_LENGTH}, "
                        f"got {value!r}")
    return tuple(value)


def _subtasks(extra: Mapping[str, Any]) -> tuple[str, ...]:
    value = extra.get("subtasks", SUBTASKS)
    if (not isinstance(value, list | tuple) or not value or len(set(value)) != len(value)
            or not all(isinstance(v, str) and v in SUBTASKS for v in value)):
        raise EvalError(f"ruler: option subtasks must be a non-empty list of distinct names among "
                        f"{', '.join(SUBTASKS)}, got {value!r}")
    return tuple(value)


CHATS = False  # the prompt is a raw haystack ending in RULER's answer prefix (build refuses chat = true)


def build(name: str, options: TaskOptions, template: object = None) -> RulerTask:
    """The task with its options: subtasks, lengths, per_cell, seed (in `options.extra`)."""
    extra = probe_extra("ruler", options, OPTION_KEYS, "zero-shot retrieval")
    check_options(name, options, generates=True, extra=True,
                  chats="the prompt is a raw haystack ending in RULER's answer prefix, not an lm-eval prompt")
    lengths = _lengths(extra)
    settings = {k: gen_settings(options, (), v) for k, v in TOKENS_TO_GENERATE.items()}
    if (short := min(lengths)) <= max(s.max_tokens for s in settings.values()):
        raise EvalError(f"ruler: length {short} leaves no room for the prompt after a generation budget of "
                        f"{max(s.max_tokens for s in settings.values())} tokens; raise the length or lower max_tokens")
    return RulerTask(subtasks=_subtasks(extra), lengths=lengths,
                     per_cell=int_option("ruler", extra, "per_cell", DEFAULT_PER_CELL, 1),
                     seed=int_option("ruler", extra, "seed", DEFAULT_SEED, 0), settings=settings,
                     think_tags=options.think_tags)
