"""The proof that the qa_kv rewrites ran: each layer's device count of the tokens its cache write rewrote
(plugin.load_counts, read from every worker after the arm) against the tokens vLLM computed for the arm.

What vLLM 0.32 writes to a layer's cache for one request (v1/core/sched/scheduler.py): every prompt token
it did not find in the prefix cache (`len(prompt_token_ids) - num_cached_tokens`; a whole-prompt hit
still recomputes the last token, and `num_cached_tokens` already leaves it out) and every generated token
fed back to produce the next one (all but the last sampled token). A prompt-logprobs pass (max_tokens 1)
writes its prompt only. That is exact unless vLLM may have computed tokens no output shows: a stop string
(the front end finds it and aborts the request while the engine core may have run further steps), async
scheduling with a request ended by a stop token (one step may already be scheduled), a preemption (the
request is recomputed), speculative decoding (rejected drafts are written too), more than one completion
per request, a batch that failed. Then each layer must have counted at least the expected tokens; where
exact, exactly them. A layer that counted nothing, or too few or (exact) too many tokens, refuses the arm.
A served arm's counts and tokens are read off its server instead (evals.engines.vllm.kv.server_counts) and
checked here the same way. Imports neither torch nor vllm.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evals.engines.vllm.kv.record import KVExecution, LayerCount, LoadCounts
from evals.errors import EngineError

SPECULATIVE = "speculative decoding (rejected drafts are written too)"  # why such a count is a lower bound


@dataclass
class TokenTally:
    """The tokens the arm's requests made vLLM write to each layer's cache (a lower bound, and whether exact)."""

    tokens: int = 0
    requests: int = 0
    inexact: list[str] = field(default_factory=list)  # why the count may exceed `tokens` (first reasons)

    def not_exact(self, why: str) -> None:
        """Note that vLLM may have written more tokens than the outputs show (`why`, kept once)."""
        if why not in self.inexact:
            self.inexact.append(why)

    def preempted(self, n: int) -> None:
        """n requests were preempted: their recomputed tokens pass through the rewrite again."""
        self.not_exact(f"{n} preemptions (recomputed tokens)")

    def speculative(self) -> None:
        """Speculative decoding ran: the drafts it rejects were written too."""
        self.not_exact(SPECULATIVE)

    def add(self, output: Any, *, async_scheduling: bool = False) -> None:
        """Count one vLLM RequestOutput: its prompt less the cached tokens, plus its generated tokens fed back."""
        self.requests += 1
        prompt = len(output.prompt_token_ids or ())
        self.tokens += prompt - int(output.num_cached_tokens or 0)
        completions = list(output.outputs or ())
        if len(completions) > 1:
            self.not_exact("a request with several completions")
        for gen in completions:
            self.tokens += max(len(gen.token_ids) - 1, 0)
            if isinstance(gen.stop_reason, str):
                self.not_exact("a stop string ended a request (the engine may have run on until the abort)")
            elif gen.finish_reason == "stop" and async_scheduling:
                self.not_exact("async scheduling with a request ended by a stop token")
            elif gen.finish_reason not in ("stop", "length"):
                self.not_exact(f"a request finished by {gen.finish_reason}")

    def add_all(self, outputs: Iterable[Any], *, async_scheduling: bool = False) -> None:
        """Count every RequestOutput of one generate call (see `add`)."""
        for out in outputs:
            self.add(out, async_scheduling=async_scheduling)


def parse_counts(answers: Sequence[str]) -> list[LoadCounts]:
    """Every worker's answer to collective_rpc(COUNTS_METHOD) (JSON lists of LoadCounts), flattened;
    EngineError for one that is not."""
    out = []
    for answer in answers:
        try:
            out += [LoadCounts.model_validate(item) for item in json.loads(answer)]
        except (TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            raise EngineError(f"vllm: a worker's qa_kv counts do not read ({type(exc).__name__})") from None
    return out


def counted_since(before: Sequence[LoadCounts], after: Sequence[LoadCounts]) -> list[LayerCount]:
    """Each layer's counts in `after` less those in `before` (the engine's warm-up writes), per load."""
    base: Mapping[tuple[int, int, str], tuple[int, int]] = {
        (c.pid, c.load, name): value for c in before for name, value in c.layers.items()}
    rows = []
    for c in after:
        for name, (tokens, nonfinite) in c.layers.items():
            t0, n0 = base.get((c.pid, c.load, name), (0, 0))
            rows.append(LayerCount(pid=c.pid, load=c.load, role=c.role, name=name, tokens=tokens - t0,
                                   nonfinite=nonfinite - n0))
    return rows


def checked_execution(rows: Sequence[LayerCount], tally: TokenTally, *, dp_ranks: int = 1) -> KVExecution:
    """The arm's execution record from its layers' counts (`rows`) and the tokens its requests made vLLM
    compute (`tally`), with `refusal` set (one clause) when a target layer counted nothing, fewer tokens than
    computed, or (exact) more; with several data-parallel ranks each rank sees only its share, so only a
    zero is refused."""
    exact = not tally.inexact and dp_ranks == 1
    note = "; ".join(tally.inexact) if tally.inexact else None
    if dp_ranks > 1:
        note = f"{dp_ranks} data-parallel ranks share the requests" + (f"; {note}" if note else "")
    targets = [r for r in rows if r.role == "target"]
    refusal = None
    if not targets:
        refusal = "no worker reported a rewritten layer's counts"
    elif tally.tokens > 0:
        for row in targets:
            low = row.tokens < tally.tokens and dp_ranks == 1
            if row.tokens <= 0 or low or (exact and row.tokens != tally.tokens):
                refusal = (f"layer {row.name} (pid {row.pid}) rewrote {row.tokens} tokens where vLLM computed "
                           f"{tally.tokens} for the arm's {tally.requests} requests"
                           + ("" if exact else f" (at least; {note})"))
                break
    return KVExecution(expected_tokens=tally.tokens, requests=tally.requests, exact=exact, note=note,
                       refusal=refusal, layers=list(rows))


def refuse_unexecuted(execution: KVExecution) -> None:
    """EngineError (one line) when the execution check refused the arm."""
    if execution.refusal is not None:
        raise EngineError(f"vllm: the qa_kv plugin's rewrites did not run as computed: {execution.refusal}; "
                          "refusing the arm")
