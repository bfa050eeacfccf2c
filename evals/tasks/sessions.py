"""`sessions`: seeded multi-turn sessions over a long shared context, the cache-path probe.

Each session opens with a context document of about `context_tokens` tokens: "key: value" facts
(synthetic keys and 7-digit values from the task's seed) followed by a few-shot block of GSM8K
training problems with their worked solutions (drawn per session with the same seed). Then come
`turns` questions: a GSM8K test problem ("Question: ...\\nAnswer:", lm-eval's gsm8k prompt) or a
look-up of one of the context's facts. Turn k's prompt is turn k-1's prompt + turn k-1's REFERENCE
answer + turn k's question, so every prompt is fixed text (the same in every arm and on every cache
path) and each turn after the first extends its predecessor: a prefix-cache hit in an engine with
prefix caching.

Every turn is served on several cache paths (evals.run.sessions): "cold" (the engine's prefix
cache emptied before the turn), "warm" (right after its prefix was served) and `shuffles` passes
"shuffled" (the cold prompts again in a seeded order and batches of `shuffle_batch`: the A/A floor of
batch history). Item id "s{NNN}/t{K}/{path}" (the k-th shuffled pass: "shuffled{k}" for k >= 2),
cluster = the session id "s{NNN}". Scores per turn under the task's own scorer, the same two metrics
for both kinds of turn: "exact_match,strict-match" (GSM8K: the number after "#### "; a look-up: the
first number) and "exact_match,flexible-extract" (GSM8K: lm-eval's last number-like span; a look-up:
the last number), exact match against the reference. The teacher-forced continuation of a turn (its
reference answer after its prompt) goes to SampleRecord.reference_logprobs.

Sizes are approximate: measured on SmolLM2's tokenizer (GPT-2-style BPE), GSM8K problems with their
solutions average 2.8 characters per token and the fact lines 1.5 (digits are single tokens).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from evals import data
from evals.data import Row
from evals.engines.base import GenerateResult
from evals.errors import EvalError
from evals.tasks.base import Item, Request, Result, Scored, TaskKind, TaskOptions
from evals.tasks.common import (
    FEWSHOT_DELIMITER,
    TARGET_DELIMITER,
    GenSettings,
    check_options,
    gen_settings,
    generate_request,
    int_option,
    probe_extra,
)
from evals.tasks.keys import adjective_noun_key
from evals.tasks.session_turns import SessionTurns, Turn, turn_prompts

Ask = Literal["gsm8k", "lookup", "mixed"]
CachePath = Literal["cold", "warm", "shuffled"]
ASKS: tuple[str, ...] = get_args(Ask)
OPTION_KEYS = ("context_tokens", "turns", "sessions", "asks", "seed", "shuffles", "shuffle_batch")
DEFAULT_CONTEXT_TOKENS = 1024
DEFAULT_TURNS = 4
DEFAULT_SESSIONS = 8
DEFAULT_SHUFFLES = 1
DEFAULT_SHUFFLE_BATCH = 4  # cold serves one request per engine call; the shuffled pass batches this many
DEFAULT_SEED = 20251201
MIN_CONTEXT_TOKENS = 128
GSM8K_CHARS_PER_TOKEN = 2.8  # measured: SmolLM2's tokenizer on GSM8K train problems + solutions
FACT_CHARS_PER_TOKEN = 1.5  # measured: "adjective-noun: 1234567" lines (one token per digit)
SHORTEST_SHOT_CHARS = 150  # about the shortest GSM8K train problem + solution: below it the block is full
FACT_SHARE = 0.25  # share of the context's tokens spent on facts; the rest is the few-shot block

# lm-eval gsm8k's stop strings; a look-up's answer is one line
GSM8K_UNTIL = ("Question:", "</s>", "<|im_end|>")
LOOKUP_UNTIL = ("\n", *GSM8K_UNTIL)
GSM8K_MAX_TOKENS = 256  # lm-eval's max_gen_toks for gsm8k
LOOKUP_MAX_TOKENS = 16
GSM8K_SETTINGS = GenSettings(until=GSM8K_UNTIL, max_tokens=GSM8K_MAX_TOKENS)
LOOKUP_SETTINGS = GenSettings(until=LOOKUP_UNTIL, max_tokens=LOOKUP_MAX_TOKENS)
INTRO = "Below are reference facts and worked examples. Answer each question that follows.\n\n"
FACTS_HEADER = "Reference facts:\n"
SHOTS_HEADER = "Worked examples:\n\n"
LOOKUP_QUESTION = "Question: What is the value of {key} in the reference facts?\nAnswer:"
STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")  # lm-eval gsm8k's strict-match regex
NUMBER_RE = re.compile(r"\d+")
INVALID = "[invalid]"  # lm-eval's RegexFilter fallback when nothing matches
NO_MORE_FACTS = "sessions: ran out of distinct fact keys; lower context_tokens"


def make_facts(rng: random.Random, n_chars: int, at_least: int) -> list[tuple[str, str]]:
    """Seeded (key, value) facts of about n_chars characters, at least `at_least` of them."""
    facts: list[tuple[str, str]] = []
    taken: set[str] = set()
    size = 0
    while size < n_chars or len(facts) < at_least:
        key = adjective_noun_key(rng, taken, numbered=True, exhausted=NO_MORE_FACTS)
        value = str(rng.randrange(1_000_000, 10_000_000))
        facts.append((key, value))
        size += len(key) + len(value) + 3
    return facts


SHOT = "Question: {question}\nAnswer:" + TARGET_DELIMITER + "{answer}" + FEWSHOT_DELIMITER  # lm-eval gsm8k's


def gsm8k_shots(rng: random.Random, train: Sequence[Row], n_chars: int, template: str = SHOT) -> str:
    """GSM8K training problems with their solutions (each rendered by `template`), drawn without replacement, at
    most n_chars long (a drawn problem that would overshoot is passed over)."""
    out, size = [], 0
    for j in rng.sample(range(len(train)), len(train)):
        if n_chars - size < SHORTEST_SHOT_CHARS:
            break
        shot = template.format(question=train[j]["question"], answer=train[j]["answer"])
        if size + len(shot) <= n_chars:
            out.append(shot)
            size += len(shot)
    return "".join(out)


def _kinds(asks: Ask, turns: int) -> list[Literal["gsm8k", "lookup"]]:
    if asks == "mixed":  # alternate, a look-up first: both kinds at every depth parity
        return ["lookup" if k % 2 == 0 else "gsm8k" for k in range(turns)]
    return [asks] * turns  # type: ignore[list-item]


def path_names(shuffles: int) -> list[str]:
    """The cache paths of every turn, in item order: cold, warm, shuffled, shuffled2, ..."""
    return ["cold", "warm", *(f"shuffled{k}" if k > 1 else "shuffled" for k in range(1, shuffles + 1))]


def score_lookup(completion: str, value: str) -> Scored:
    """A look-up turn: strict-match = the first number, flexible-extract = the last, exact match with the value."""
    numbers = NUMBER_RE.findall(completion)
    extracted = {"strict-match": numbers[0] if numbers else INVALID,
                 "flexible-extract": numbers[-1] if numbers else INVALID}
    return Scored(scores={f"exact_match,{k}": float(v == value) for k, v in extracted.items()},
                  extracted=dict(extracted), target=value)


@dataclass(frozen=True)
class SessionsTask(SessionTurns):
    """Multi-turn sessions, every turn an item on each cache path."""

    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    turns: int = DEFAULT_TURNS
    sessions: int = DEFAULT_SESSIONS
    asks: Ask = "mixed"
    seed: int = DEFAULT_SEED
    shuffles: int = DEFAULT_SHUFFLES
    shuffle_batch: int = DEFAULT_SHUFFLE_BATCH
    gsm8k_settings: GenSettings = GSM8K_SETTINGS
    lookup_settings: GenSettings = LOOKUP_SETTINGS
    reference_signal: bool = True
    think_tags: tuple[str, str] | None = None
    name: str = "sessions"
    version: str = "1"
    kind: TaskKind = "generate"

    def build_sessions(self, data_dir: Path | None) -> list[tuple[str, list[Turn]]]:
        """(context, turns) of every session, from the task's seed; EvalError when the data is too small."""
        kinds = _kinds(self.asks, self.turns)
        needed = self.sessions * kinds.count("gsm8k")
        test = data.load("gsm8k", data_dir, "test") if needed else []
        train = data.load("gsm8k", data_dir, "train")
        if needed > len(test):
            raise EvalError(f"sessions: {self.sessions} sessions x {kinds.count('gsm8k')} GSM8K turns need {needed} "
                            f"test problems; the data has {len(test)}: lower sessions or turns")
        questions = iter(random.Random(f"{self.seed}/gsm8k").sample(range(len(test)), needed))
        fact_tokens = int(self.context_tokens * FACT_SHARE)
        out = []
        for n in range(self.sessions):
            rng = random.Random(f"{self.seed}/s{n:03d}")
            facts = make_facts(rng, int(fact_tokens * FACT_CHARS_PER_TOKEN), kinds.count("lookup"))
            shot_chars = int((self.context_tokens - fact_tokens) * GSM8K_CHARS_PER_TOKEN)
            context = (INTRO + FACTS_HEADER + "".join(f"{k}: {v}\n" for k, v in facts) + "\n"
                       + SHOTS_HEADER + gsm8k_shots(rng, train, shot_chars))
            asked = iter(rng.sample(facts, kinds.count("lookup")))
            turns = []
            for kind in kinds:
                if kind == "gsm8k":
                    doc = test[next(questions)]
                    turns.append(Turn("gsm8k", f"Question: {doc['question']}\nAnswer:", doc["answer"],
                                      source=str(doc["id"])))
                else:
                    key, value = next(asked)
                    turns.append(Turn("lookup", LOOKUP_QUESTION.format(key=key), value, source=key))
            out.append((context, turns))
        return out

    def items(self, data_dir: Path | None) -> list[Item]:
        """sessions x turns x cache paths, session-major, turn by turn, paths in `path_names` order."""
        items = []
        for n, (context, turns) in enumerate(self.build_sessions(data_dir)):
            session = f"s{n:03d}"
            for k, (turn, prompt) in enumerate(zip(turns, turn_prompts(context, turns), strict=True), start=1):
                for path in path_names(self.shuffles):
                    items.append(Item(item_id=f"{session}/t{k}/{path}", cluster=session, doc={
                        "session": session, "turn": k, "path": path, "ask": turn.kind, "prompt": prompt,
                        "answer": turn.answer, "source": turn.source, "context_chars": len(context)}))
        return items

    @property
    def max_new_tokens(self) -> int:
        """The larger generation budget of the two kinds of turn (what the session runner sizes the window with)."""
        return max(self.gsm8k_settings.max_tokens, self.lookup_settings.max_tokens)

    def plan_note(self) -> str:
        """What the probe runs, one line (the power plan shows it)."""
        return (f"{self.sessions} sessions x {self.turns} {self.asks} turns over ~{self.context_tokens} tokens, served "
                f"{', '.join(self.path_names())}; the estimate pairs the cold path, {self.sessions} clusters")

    def path_names(self) -> list[str]:
        """This probe's cache paths, in item order."""
        return path_names(self.shuffles)

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """Generate after the turn's prompt (the same on every path) with the settings of its kind of turn."""
        settings = self.gsm8k_settings if item.doc["ask"] == "gsm8k" else self.lookup_settings
        return generate_request(item.doc["prompt"], settings, seed)

    def score(self, item: Item, result: Result) -> Scored:
        """GSM8K turns: lm-eval gsm8k's exact match (strict and flexible); look-ups: the value's exact match."""
        assert isinstance(result, GenerateResult)
        meta = {"ask": item.doc["ask"]}
        if item.doc["ask"] == "lookup":
            scored = score_lookup(result.text, item.doc["answer"])
        else:
            scored = score_gsm8k(result.text, item.doc["answer"])
        return Scored(scores=scored.scores, extracted=scored.extracted, target=scored.target, meta=meta)


def score_gsm8k(completion: str, solution: str) -> Scored:
    """A GSM8K turn: lm-eval gsm8k's exact match, strict ("#### N") and flexible (the last number)."""
    # lm-eval is imported only here: the vLLM venv has none, and its tests ask look-ups only
    from evals.tasks.exact_match import exact_match_scored  # lm_eval: exact_match loads it
    from evals.tasks.gsm8k import NORMALISATION, VARIANTS, extract  # lm_eval: gsm8k loads it

    return exact_match_scored(extract(completion, VARIANTS["gsm8k"]), solution, NORMALISATION)


CHATS = False  # a session is one growing raw prompt (build refuses chat = true)


def _ask(extra: Mapping[str, Any]) -> Ask:
    value = extra.get("asks", "mixed")
    if value not in ASKS:
        raise EvalError(f"sessions: option asks must be one of {', '.join(ASKS)}, got {value!r}")
    return value


def build(name: str, options: TaskOptions, template: object = None) -> SessionsTask:
    """The probe with its options (context_tokens, turns, sessions, asks, seed, shuffles, shuffle_batch)."""
    extra = probe_extra("sessions", options, OPTION_KEYS, "the context holds its own worked examples")
    check_options(name, options, generates=True, extra=True,
                  chats="a session is one growing raw prompt, not an lm-eval prompt")
    return SessionsTask(
        context_tokens=int_option("sessions", extra, "context_tokens", DEFAULT_CONTEXT_TOKENS, MIN_CONTEXT_TOKENS),
        turns=int_option("sessions", extra, "turns", DEFAULT_TURNS, 1),
        sessions=int_option("sessions", extra, "sessions", DEFAULT_SESSIONS, 1),
        asks=_ask(extra),
        seed=int_option("sessions", extra, "seed", DEFAULT_SEED, 0),
        shuffles=int_option("sessions", extra, "shuffles", DEFAULT_SHUFFLES, 0),
        shuffle_batch=int_option("sessions", extra, "shuffle_batch", DEFAULT_SHUFFLE_BATCH, 2),
        gsm8k_settings=gen_settings(options, GSM8K_UNTIL, GSM8K_MAX_TOKENS),
        lookup_settings=gen_settings(options, LOOKUP_UNTIL, LOOKUP_MAX_TOKENS),
        reference_signal=options.reference_signal,
        think_tags=options.think_tags,
    )
