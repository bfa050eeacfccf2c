"""`agentic`: long seeded multi-turn sessions with tool calls, served on cache paths (evals.run.sessions).

A session opens with a context: an instruction, the JSON docs of `functions` documented functions (BFCL's
shape, a seeded subset of evals.tasks.tool_catalog, both text-reading functions always among them),
reference facts ("key: 7-digit value"), worked examples (a tool call with its result, a look-up, GSM8K
training problems with their solutions) up to about `context_tokens` (the GSM8K problems fill what the rest
leaves; with 8 functions the rest alone is about 1.1K tokens). Then `turns` turns, each
"User: ...\\nAssistant:", of the kinds `cycle` repeats:
- "tool": a request one documented function answers; the reference answer is the call in Python syntax,
  "[name(param=value, ...)]", followed by the function's result on a "Tool:" line. Tool turns alternate
  between a read function (its result carries a passage of WikiText-2: how the session grows) and an
  action; some actions take their arguments from the reference facts (a dependency far back).
- "lookup": the value of one reference fact (far back: the facts open the session).
- "gsm8k": a GSM8K test problem; the reference answer is its worked solution.
Turn k's prompt is the context plus every earlier turn with its REFERENCE answer and tool result, plus turn
k's question: fixed text, the same in every arm and on every cache path, each turn extending the one before
(a prefix-cache hit). The read results are sized so the last turn's prompt is about `session_tokens`.

Item id "s{NNN}/t{K}/{path}" for every path of `paths` (and `shuffles` shuffled passes), cluster = the
session. Scores, the same two keys for every kind: "exact_match,strict-match" (tool: the completion decodes
as a call list that passes BFCL's AST checker, evals.tasks.tool_calls; look-up: the first number; GSM8K:
lm-eval's "#### N") and "exact_match,flexible-extract" (tool: the first bracketed call list anywhere in the
completion; look-up: the last number; GSM8K: lm-eval's last number). Record meta: "kind", "prompt_chars",
and for tool turns "function", "tool_parsed" (the completion decodes as calls: valid), "tool_correct"
(strict) and "tool_error" (BFCL's error type). The teacher-forced continuation is the reference answer.

`agentic_bfcl` is the same with the tool turns of BFCL's multi-turn base entries (evals.tasks.bfcl, read
from the installed bfcl-eval at run time): one entry per session (a seeded draw among the entries whose
function docs fit `context_tokens`), its classes' docs in the context, its user turns in the tool slots of
`cycle` in order (slots past its last turn dropped, so a session may have fewer than `turns` turns; the 3
turns that expect no call are left out), the
ground-truth calls as reference answers and BFCL's executor's results after them; records name the entry
("tool_source"), and the report shows its changed answers by record id only.

Sizes are approximate (CHARS_PER_TOKEN, measured on SmolLM2's tokenizer; Gemma-3's is within 10%); the
session runner refuses a session whose longest turn does not fit the model's window, counted with the real
tokenizer, before anything runs.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from evals import data
from evals.engines.base import GenerateResult
from evals.errors import EvalError
from evals.tasks.agentic_text import (
    CHARS_PER_TOKEN,
    CONVERSATION_HEADER,
    EXAMPLES_HEADER,
    FACTS_HEADER,
    FUNCTIONS_HEADER,
    INTRO,
    LINE_UNTIL,
    LOOKUP_TEXT,
    QUESTION,
    SHOT,
    USER_UNTIL,
    haystack_lines,
    passage,
    score_tool,
)
from evals.tasks.base import Item, Request, Result, Scored, TaskKind, TaskOptions
from evals.tasks.bfcl import BFCL_VERSION, BfclEntry, load_entries
from evals.tasks.common import (
    TARGET_DELIMITER,
    GenSettings,
    check_options,
    gen_settings,
    generate_request,
    int_option,
    probe_extra,
)
from evals.tasks.session_turns import KINDS, TURN_END, Kind, SessionTurns, Turn, history_text, turn_prompts
from evals.tasks.sessions import (
    GSM8K_UNTIL,
    gsm8k_shots,
    make_facts,
    path_names,
    score_gsm8k,
    score_lookup,
)
from evals.tasks.tool_calls import FunctionDoc
from evals.tasks.tool_catalog import ACTIONS, CATALOGUE, READERS, Draw, Fact, ToolTurn

Tools = Literal["generated", "bfcl"]
ToolSlot = Callable[[Draw], ToolTurn]  # draws the tool turn of one slot (the generated catalogue or BFCL)

PATHS = ("cold", "warm")  # the shuffled passes are `shuffles`
OPTION_KEYS = ("sessions", "turns", "session_tokens", "context_tokens", "functions", "cycle", "paths", "seed",
               "shuffles", "shuffle_batch")
DEFAULT_SESSIONS = 4
DEFAULT_TURNS = 16
DEFAULT_SESSION_TOKENS = 4096
DEFAULT_CONTEXT_TOKENS = 1536
DEFAULT_BFCL_CONTEXT_TOKENS = 5120  # BFCL's smallest entries list about 3.6K tokens of function docs
DEFAULT_FUNCTIONS = 8
DEFAULT_CYCLE: tuple[Kind, ...] = ("tool", "lookup", "tool", "gsm8k")
DEFAULT_SEED = 20250325  # any fixed value; the same in both arms
DEFAULT_SHUFFLE_BATCH = 4
MIN_CONTEXT_TOKENS = 512
BFCL_HEADROOM = 400  # tokens of context besides a BFCL entry's function docs (instruction, facts, example)
FACT_SHARE = 0.15  # share of context_tokens spent on reference facts
MIN_PASSAGE_CHARS = 120  # a read function returns at least this much text
TOOL_MAX_TOKENS = 96  # the longest reference call of the catalogue is about 50 tokens
LOOKUP_MAX_TOKENS = 16
GSM8K_MAX_TOKENS = 256  # lm-eval gsm8k's max_gen_toks


@dataclass(frozen=True)
class Session:
    """A session: its context, turns and the function docs its context lists."""

    context: str
    turns: tuple[Turn, ...]
    docs: tuple[FunctionDoc, ...] = ()


@dataclass(frozen=True)
class AgenticTask(SessionTurns):
    """Long tool-calling sessions, every turn an item on each cache path."""

    sessions: int = DEFAULT_SESSIONS
    turns: int = DEFAULT_TURNS
    session_tokens: int = DEFAULT_SESSION_TOKENS
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    functions: int = DEFAULT_FUNCTIONS
    cycle: tuple[Kind, ...] = DEFAULT_CYCLE
    paths: tuple[str, ...] = PATHS
    seed: int = DEFAULT_SEED
    shuffles: int = 0
    shuffle_batch: int = DEFAULT_SHUFFLE_BATCH
    settings: Mapping[str, GenSettings] | None = None  # per kind; None: the defaults
    reference_signal: bool = True
    think_tags: tuple[str, str] | None = None
    tools: Tools = "generated"
    name: str = "agentic"
    version: str = "1"
    kind: TaskKind = "generate"

    def kinds(self) -> list[Kind]:
        """The kind of every turn: `cycle` repeated."""
        return [self.cycle[k % len(self.cycle)] for k in range(self.turns)]

    def _settings(self, kind: str) -> GenSettings:
        return (self.settings or DEFAULT_SETTINGS)[kind]

    @property
    def max_new_tokens(self) -> int:
        """The largest generation budget of any kind of turn (what the session runner sizes the window with)."""
        return max(self._settings(k).max_tokens for k in set(self.kinds()))

    def _plan(self, rng: random.Random, entry: BfclEntry | None) -> tuple[list[Kind], list[ToolSlot | None], list[str], int]:
        """(kinds, one tool slot per turn or None, documented functions as JSON lines, facts the turns use).
        Generated: tool slots alternate a read function and an action; BFCL: the entry's turns in order (tool
        slots past its last turn are dropped)."""
        if entry is not None:
            turns = iter(t for t in entry.turns if t.calls)  # 3 of BFCL's 734 turns expect no call: left out
            kinds: list[Kind] = []
            slots: list[ToolSlot | None] = []
            for kind in self.kinds():
                if kind == "tool":
                    bt = next(turns, None)
                    if bt is None:
                        continue
                    slots.append(lambda _d, t=bt, e=entry.id: ToolTurn(
                        " ".join(c.name for c in t.calls), t.request, t.calls, t.answers, t.result, False, e))
                else:
                    slots.append(None)
                kinds.append(kind)
            return kinds, slots, [json.dumps(d) for d in entry.docs], 0
        readers = list(READERS)
        actions = rng.sample(ACTIONS, self.functions - len(readers))
        chosen = readers + actions
        rng.shuffle(chosen)
        slots, tool_k, facts = [], 0, 0
        for kind in self.kinds():
            fn = None
            if kind == "tool":
                fn = rng.choice(readers) if tool_k % 2 == 0 else rng.choice(actions)
                tool_k, facts = tool_k + 1, facts + fn.facts
            slots.append(fn.draw if fn is not None else None)
        return self.kinds(), slots, [json.dumps(f.doc) for f in chosen], facts

    def _session(self, n: int, tests: list[Mapping[str, Any]], train: Sequence[Mapping[str, Any]],
                 lines: Sequence[str], entry: BfclEntry | None = None) -> Session:
        rng = random.Random(f"{self.seed}/s{n:03d}")
        kinds, slots, doc_lines, tool_facts = self._plan(rng, entry)
        example = None if entry is not None else next(
            (f for f in ACTIONS if f.facts == 0 and json.dumps(f.doc) in doc_lines), None)
        need = kinds.count("lookup") + tool_facts + 1
        fact_tokens = int(self.context_tokens * FACT_SHARE)
        facts = [Fact(k, v) for k, v in make_facts(rng, int(fact_tokens * CHARS_PER_TOKEN["fact"]), need)]
        asked = rng.sample(facts, need)  # consumed from the end
        docs = "".join(d + "\n" for d in doc_lines)
        examples = ""
        if example is not None:
            shown = example.draw(Draw(random.Random(f"{self.seed}/s{n:03d}/example"), asked, lambda: ""))
            examples = QUESTION.format(text=shown.request) + TARGET_DELIMITER + shown.answer + f"\nTool: {shown.result}" + TURN_END
        lookup_fact = asked.pop()
        examples += (QUESTION.format(text=LOOKUP_TEXT.format(key=lookup_fact.key)) + TARGET_DELIMITER
                     + lookup_fact.value + TURN_END)
        head = (INTRO + FUNCTIONS_HEADER + docs + "\n" + FACTS_HEADER
                + "".join(f"{f.key}: {f.value}\n" for f in facts) + "\n" + EXAMPLES_HEADER + examples)
        used = len(INTRO + FUNCTIONS_HEADER + docs + examples) / CHARS_PER_TOKEN["json"] + fact_tokens
        shot_chars = int(max(0.0, self.context_tokens - used) * CHARS_PER_TOKEN["gsm8k"])
        context = head + gsm8k_shots(rng, train, shot_chars, SHOT) + CONVERSATION_HEADER

        def build(passage_chars: int) -> list[Turn]:
            pool, todo, out = list(asked), list(tests), []
            for k, (kind, slot) in enumerate(zip(kinds, slots, strict=True), start=1):
                turn_rng = random.Random(f"{self.seed}/s{n:03d}/t{k}")
                if slot is not None:
                    tool = slot(Draw(turn_rng, pool, lambda r=turn_rng: passage(lines, r, passage_chars)))
                    out.append(Turn("tool", QUESTION.format(text=tool.request), tool.answer, f"\nTool: {tool.result}",
                                    tool.source or tool.function, tool))
                elif kind == "lookup":
                    fact = pool.pop()
                    out.append(Turn("lookup", QUESTION.format(text=LOOKUP_TEXT.format(key=fact.key)), fact.value,
                                    source=fact.key))
                else:
                    doc = todo.pop()
                    out.append(Turn("gsm8k", QUESTION.format(text=doc["question"]), doc["answer"], source=str(doc["id"])))
            return out

        bare = build(0)
        reads = sum(t.tool is not None and t.tool.reads for t in bare)
        documented = tuple(json.loads(d) for d in doc_lines)
        if not reads:
            return Session(context, tuple(bare), documented)
        fact_chars = sum(len(f.key) + len(f.value) + 3 for f in facts)
        est = (len(context) - fact_chars) / CHARS_PER_TOKEN["json"] + fact_chars / CHARS_PER_TOKEN["fact"] + sum(
            len(history_text(t)) / CHARS_PER_TOKEN["gsm8k" if t.kind == "gsm8k" else "turn"] for t in bare)
        budget = (self.session_tokens - est) * CHARS_PER_TOKEN["wiki"] / reads
        return Session(context, tuple(build(max(MIN_PASSAGE_CHARS, int(budget)))), documented)

    def entries(self) -> list[BfclEntry]:
        """The BFCL entries of the sessions (agentic_bfcl): a seeded draw among those whose function docs fit
        context_tokens; EvalError naming the context they need when too few fit."""
        every = load_entries()
        fits = [e for e in every if e.doc_chars / CHARS_PER_TOKEN["json"] + BFCL_HEADROOM <= self.context_tokens]
        if len(fits) < self.sessions:
            need = sorted(int(e.doc_chars / CHARS_PER_TOKEN["json"]) + BFCL_HEADROOM for e in every)[self.sessions - 1]
            raise EvalError(f"agentic_bfcl: {len(fits)} BFCL entries' function docs fit context_tokens "
                            f"{self.context_tokens}; {self.sessions} sessions need context_tokens >= {need}")
        return random.Random(f"{self.seed}/bfcl").sample(fits, self.sessions)

    def build_sessions(self, data_dir: Path | None) -> list[Session]:
        """Every session, from the task's seed; EvalError when the data is too small."""
        n_gsm = self.kinds().count("gsm8k")
        test = data.load("gsm8k", data_dir, "test") if n_gsm else []
        train = data.load("gsm8k", data_dir, "train")
        lines = haystack_lines(data.load("wikitext2", data_dir, "test")) if self.tools == "generated" else []
        if self.sessions * n_gsm > len(test):
            raise EvalError(f"agentic: {self.sessions} sessions x {n_gsm} GSM8K turns need {self.sessions * n_gsm} "
                            f"test problems; the data has {len(test)}: lower sessions or turns")
        order = random.Random(f"{self.seed}/gsm8k").sample(range(len(test)), self.sessions * n_gsm)
        entries = self.entries() if self.tools == "bfcl" else [None] * self.sessions
        out = []
        for n, entry in enumerate(entries):
            mine = [test[j] for j in reversed(order[n * n_gsm:(n + 1) * n_gsm])]  # popped from the end
            out.append(self._session(n, mine, train, lines, entry))
        return out

    def plan_note(self) -> str:
        """What the task runs, one line (the power plan shows it)."""
        counts = ", ".join(f"{self.kinds().count(k)} {k}" for k in KINDS if k in self.cycle)
        size = (f"to ~{self.session_tokens} tokens" if self.tools == "generated"
                else f"BFCL multi-turn entries, context ~{self.context_tokens} tokens")
        paths = ", ".join(self.path_names())
        primary = "cold" if "cold" in self.paths else "warm"
        return (f"{self.sessions} sessions x {self.turns} turns ({counts}), {size}, served {paths}; the estimate "
                f"pairs the {primary} path, {self.sessions} clusters (sessions): CR1 with {self.sessions - 1} df")

    def path_names(self) -> list[str]:
        """This task's cache paths, in item order."""
        return [p for p in path_names(self.shuffles) if p in self.paths or p.startswith("shuffled")]

    def items(self, data_dir: Path | None) -> list[Item]:
        """sessions x turns x cache paths, session-major, turn by turn, paths in `path_names` order."""
        items = []
        for n, s in enumerate(self.build_sessions(data_dir)):
            session = f"s{n:03d}"
            for k, (turn, prompt) in enumerate(zip(s.turns, turn_prompts(s.context, s.turns), strict=True), start=1):
                tool = None
                if turn.tool is not None:
                    tool = {"function": turn.tool.function, "answer": turn.answer, "answers": list(turn.tool.answers),
                            "docs": [d for d in s.docs if d["name"] in {c.name for c in turn.tool.calls}],
                            "source": turn.tool.source}
                for path in self.path_names():
                    items.append(Item(item_id=f"{session}/t{k}/{path}", cluster=session, doc={
                        "session": session, "turn": k, "path": path, "ask": turn.kind, "prompt": prompt,
                        "answer": turn.answer, "source": turn.source, "context_chars": len(s.context), "tool": tool}))
        return items

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """Generate after the turn's prompt (the same on every path) with its kind's settings."""
        return generate_request(item.doc["prompt"], self._settings(item.doc["ask"]), seed)

    def score(self, item: Item, result: Result) -> Scored:
        """Tool turns: BFCL's AST match; look-ups: the value's exact match; GSM8K: lm-eval's exact match."""
        assert isinstance(result, GenerateResult)
        kind = item.doc["ask"]
        if kind == "tool":
            scored = score_tool(result.text, item.doc["tool"])
        elif kind == "lookup":
            scored = score_lookup(result.text, item.doc["answer"])
        else:
            scored = score_gsm8k(result.text, item.doc["answer"])
        meta = {"kind": kind, "prompt_chars": len(item.doc["prompt"]), **scored.meta}
        return Scored(scores=scored.scores, extracted=scored.extracted, target=scored.target, meta=meta)


DEFAULT_SETTINGS: dict[str, GenSettings] = {
    "tool": GenSettings(until=LINE_UNTIL, max_tokens=TOOL_MAX_TOKENS),
    "lookup": GenSettings(until=LINE_UNTIL, max_tokens=LOOKUP_MAX_TOKENS),
    "gsm8k": GenSettings(until=(*USER_UNTIL, *GSM8K_UNTIL), max_tokens=GSM8K_MAX_TOKENS),
}
CHATS = False  # a session is one growing raw prompt (build refuses chat = true)


def _names(extra: Mapping[str, Any], key: str, default: tuple[str, ...], allowed: tuple[str, ...]) -> tuple[Any, ...]:
    value = extra.get(key, default)
    if (not isinstance(value, list | tuple) or not value or not all(isinstance(v, str) for v in value)
            or (bad := sorted(set(value) - set(allowed)))):
        shown = f" ({', '.join(bad)} unknown)" if isinstance(value, list | tuple) and value and all(
            isinstance(v, str) for v in value) else ""
        raise EvalError(f"agentic: option {key} must be a non-empty list of {', '.join(allowed)}, got {value!r}{shown}")
    return tuple(value)


BFCL_UNREAD = {"session_tokens": "a session's length follows its BFCL entry's docs and results",
               "functions": "the functions are the BFCL entry's"}


def build(name: str, options: TaskOptions, template: object = None) -> AgenticTask:
    """The task (`agentic`, or `agentic_bfcl`: tool turns from BFCL) with its options (module doc); each
    refused in one line when out of range or not read."""
    extra = probe_extra(name, options, OPTION_KEYS, "the context holds its own worked examples")
    check_options(name, options, generates=True, extra=True,
                  chats="a session is one growing raw prompt, not an lm-eval prompt")
    tools: Tools = "bfcl" if name == "agentic_bfcl" else "generated"
    if tools == "bfcl" and (unread := [k for k in BFCL_UNREAD if k in extra]):
        raise EvalError(f"{name}: option {unread[0]} is not read ({BFCL_UNREAD[unread[0]]}); leave it unset")
    paths = _names(extra, "paths", PATHS, PATHS)
    if len(set(paths)) != len(paths):
        raise EvalError(f"agentic: option paths lists a path twice: {list(paths)}")
    context = int_option("agentic", extra, "context_tokens",
                         DEFAULT_BFCL_CONTEXT_TOKENS if tools == "bfcl" else DEFAULT_CONTEXT_TOKENS, MIN_CONTEXT_TOKENS)
    session = int_option("agentic", extra, "session_tokens", max(DEFAULT_SESSION_TOKENS, context + 1), context + 1)
    functions = int_option("agentic", extra, "functions", DEFAULT_FUNCTIONS, len(READERS) + 1)
    if functions > len(CATALOGUE):
        raise EvalError(f"agentic: option functions must be at most {len(CATALOGUE)} (the catalogue), got {functions}")
    settings = {k: gen_settings(options, s.until, s.max_tokens) for k, s in DEFAULT_SETTINGS.items()}
    return AgenticTask(
        sessions=int_option("agentic", extra, "sessions", DEFAULT_SESSIONS, 1),
        turns=int_option("agentic", extra, "turns", DEFAULT_TURNS, 1),
        session_tokens=session, context_tokens=context, functions=functions,
        cycle=_names(extra, "cycle", DEFAULT_CYCLE, KINDS), paths=paths,
        seed=int_option("agentic", extra, "seed", DEFAULT_SEED, 0),
        shuffles=int_option("agentic", extra, "shuffles", 0, 0),
        shuffle_batch=int_option("agentic", extra, "shuffle_batch", DEFAULT_SHUFFLE_BATCH, 2),
        settings=settings, reference_signal=options.reference_signal, think_tags=options.think_tags, tools=tools,
        name=name, version=f"1+bfcl-{BFCL_VERSION}-ast" if tools == "bfcl" else "1")
