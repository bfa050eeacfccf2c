"""Serve a session task (the `sessions` probe, the `agentic` task) on its cache paths, inside one arm: cold,
warm and shuffled (the paths the task names; `sessions` serves all three).

Per session (evals.tasks.sessions / evals.tasks.agentic build them):
- cold: for each turn, `reset_prefix_cache()`, generate the turn alone, reset again, teacher-force its
  reference answer alone: nothing served earlier can be reused (each cold turn stands alone);
- warm: reset, serve the session's shared context once (a one-token generation, not recorded), then
  turns 1..T in order, each generation followed by its teacher-forced pass: turn k is served right
  after its prefix (turn k-1's prompt and reference answer), a prefix-cache hit;
- shuffled (`shuffles` passes): every cold prompt of the probe again, in a seeded order (per pass), in
  batches of `shuffle_batch` with a reset before each batch's generation and before its teacher-forced
  pass: the batch-history A/A floor (requests of one batch may hit each other's prefixes; recorded).

Requests reach the engine one engine call per step in the order above (nothing is reordered: a
call holds one request, or one shuffled batch). Records: item id "s{NNN}/t{K}/{path}", cluster the
session, meta {"session", "turn", "cache_path", "ask", "prompt_tokens", "cached_tokens"} (the
engine's own per-request numbers, None where it gives none) plus the engine's cumulative counters
(PrefixCacheStats) as deltas: "counter_queried_tokens"/"counter_hit_tokens" over the generation call
that served the turn, "reference_queried_tokens"/"reference_hit_tokens" over its teacher-forced call
(on the cold and warm paths a call holds the turn alone; a shuffled record gets its batch's totals),
"path_queried_tokens"/"path_hit_tokens" over the session's whole path (warm: the served context
included; shuffled: the batch), and "hit_source" (PrefixCacheStats.source). The counters go into the records' meta, not
arm.json. A hit rate of 0 (or counters that say "none") means the path carried no information.

Resume: records are keyed as above; a session's warm path with a record missing is served again
whole (its history is the point), a cold turn alone (it starts from a reset), a shuffled batch whole;
only the missing records are written. Repeats must be 1 and `limit` unset (the options size the probe).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evals.engines import base
from evals.engines.base import Engine, PrefixCacheControl, PrefixCacheStats, TokenLogprobs
from evals.errors import EngineError, EvalError
from evals.prompts.reasoning import is_truncated, split_reasoning, think_tags
from evals.records.samples import RecordWriter, SampleRecord, first_non_finite, sha256_text
from evals.run.context_fit import SESSION_LENGTH_OPTIONS, session_overflow
from evals.run.progress import settings_from_env, task_progress
from evals.run.reference import record_fields
from evals.run.resume import RunSummary, missing_samples
from evals.run.selection import sample_seed
from evals.tasks.base import Item

if TYPE_CHECKING:  # the task modules read GSM8K (evals.data, numpy): not needed to serve them
    from evals.tasks.agentic import AgenticTask
    from evals.tasks.sessions import SessionsTask

    SessionTask = SessionsTask | AgenticTask

log = logging.getLogger(__name__)

Meta = dict[str, str | int | float | bool | None]
# What to set so an engine serves the warm path from a prefix cache
PREFIX_CACHE_HINTS = {
    "hf": "set engine_args.kv.prefix_cache = { enabled = true } (replay_window as you mean to test)",
    "vllm": "leave enable_prefix_caching on (vLLM's default) in the arm's engine_args",
    "openai": "serve the model with prefix caching on (vLLM: its default; llama.cpp: cache_prompt)",
}
NO_COUNTERS = PrefixCacheStats(queried_tokens=0, hit_tokens=0, source="none")


def prefix_cache_of(engine: Engine) -> PrefixCacheControl | None:
    """The engine as a PrefixCacheControl when its prefix cache is on, else None."""
    if not isinstance(engine, PrefixCacheControl) or not getattr(engine, "prefix_cache_enabled", True):
        return None
    return engine


def require_prefix_cache(engine: Engine, task: str = "sessions") -> PrefixCacheControl:
    """The engine as a PrefixCacheControl with its prefix cache on; one-line EngineError naming what to set."""
    control = prefix_cache_of(engine)
    if control is None:
        hint = PREFIX_CACHE_HINTS.get(engine.info.name, "use an engine with a prefix cache")
        raise EngineError(f"{task}: the {engine.info.name} engine has no prefix cache to serve the warm path "
                          f"from; {hint}")
    return control


class _NoCache:
    """A cold-only run on an engine without a prefix cache: nothing to reset, no counters."""

    def reset_prefix_cache(self) -> None:
        """Nothing is cached between requests."""

    def prefix_cache_stats(self) -> PrefixCacheStats:
        """No counters."""
        return NO_COUNTERS


def _encoder(engine: Engine) -> Callable[[str], list[int]] | None:
    tokens = getattr(engine, "tokens", None) or getattr(engine, "tokenizer", None)
    return getattr(tokens, "encode", None)


def check_fits(engine: Engine, task: SessionTask, items: Sequence[Item]) -> None:
    """EvalError when a session's longest turn (prompt + reference + generation budget) exceeds the engine's
    window, where the engine says both its window and its tokenizer (hf, vllm): the check `qa run` makes before
    any arm starts (evals.run.context_fit.session_overflow), made again by the engine that serves the turns."""
    window = getattr(engine, "max_model_len", None) or getattr(engine, "max_length", None)
    encode = _encoder(engine)
    if not isinstance(window, int) or encode is None or not items:
        return
    over = session_overflow(task, items, encode, window)
    if over is not None:
        length = SESSION_LENGTH_OPTIONS.get(task.name, "context_tokens")
        raise EvalError(f"{task.name}: the longest turn needs {over.need} tokens ({over.what}); the model's window "
                        f"is {window}: lower {length}, turns or max_tokens")


@dataclass(frozen=True)
class _Turn:
    item: Item
    request: base.GenerateRequest
    prompt_hash: str
    seed: int


def _stats(control: PrefixCacheControl) -> PrefixCacheStats:
    try:
        return control.prefix_cache_stats()
    except EngineError as exc:  # an engine that cannot count says so: the records then hold "none"
        log.warning("prefix-cache counters not available: %s", exc)
        return NO_COUNTERS


def _delta(before: PrefixCacheStats, after: PrefixCacheStats, what: str) -> Meta:
    if after.source == NO_COUNTERS.source:
        return {f"{what}_queried_tokens": None, f"{what}_hit_tokens": None}
    return {f"{what}_queried_tokens": after.queried_tokens - before.queried_tokens,
            f"{what}_hit_tokens": after.hit_tokens - before.hit_tokens}


def _call(fn: Callable[[list[Any]], list[Any]], requests: list[Any]) -> list[Any]:
    """One engine call; a call that raises answers Failure in every slot."""
    try:
        results = list(fn(requests))
    except EvalError:
        raise
    except Exception as exc:  # noqa: BLE001 - the whole call failed: each of its samples records it
        return [base.Failure(f"{type(exc).__name__}: {exc}")] * len(requests)
    if len(results) != len(requests):
        raise EngineError(f"engine returned {len(results)} results for {len(requests)} requests")
    return results


class _Server:
    """Serves turns on one engine and turns the answers into records (one per turn and path)."""

    def __init__(self, engine: Engine, control: PrefixCacheControl, task: SessionTask, arm: str) -> None:
        self.engine, self.control, self.task, self.arm = engine, control, task, arm

    def serve(self, turns: Sequence[_Turn], reset: bool) -> list[tuple[Any, TokenLogprobs | base.Failure | None, Meta]]:
        """Generate the turns in one call, then teacher-force their references in one call (a reset
        before each when `reset`); per turn (result, reference, counter meta)."""
        if reset:
            self.control.reset_prefix_cache()
        s0 = _stats(self.control)
        results = _call(self.engine.generate, [t.request for t in turns])
        s1 = _stats(self.control)
        refs: list[TokenLogprobs | base.Failure | None] = [None] * len(turns)
        if self.task.reference_signal:
            if reset:
                self.control.reset_prefix_cache()
                s1 = _stats(self.control)
            refs = _call(self.engine.token_logprobs, [self.task.reference_request(t.item) for t in turns])
        s2 = _stats(self.control)
        meta = {**_delta(s0, s1, "counter"), **_delta(s1, s2, "reference"), "hit_source": s2.source}
        return [(res, ref, dict(meta)) for res, ref in zip(results, refs, strict=True)]

    def record(self, turn: _Turn, result: Any, reference: TokenLogprobs | base.Failure | None,
               meta: Meta) -> SampleRecord:
        """The SampleRecord of one turn on one path; a failed generation has its error and no scores."""
        item, task = turn.item, self.task
        meta = {"session": item.doc["session"], "turn": item.doc["turn"], "cache_path": item.doc["path"].rstrip(
            "0123456789"), "ask": item.doc["ask"], "prompt_tokens": None, "cached_tokens": None, **meta}
        if turn.request.temperature > 0:
            meta["sample_seed"] = turn.seed
        fields: dict[str, Any] = {}
        scores: dict[str, float | None] = {}
        extracted: dict[str, str | None] = {}
        target: str | None = None
        error: str | None = None
        if isinstance(result, base.Failure):
            error = f"engine: {result.error}"
        else:
            split = split_reasoning(result.text, think_tags(task), prompt=turn.request.prompt,
                                    server_reasoning=result.reasoning)
            result = replace(result, text=split.answer, reasoning=split.reasoning)
            meta.update(prompt_tokens=result.prompt_tokens, cached_tokens=result.cached_tokens)
            fields = {"completion": split.answer, "reasoning": split.reasoning, "output_tokens": result.output_tokens,
                      "finish_reason": result.finish_reason}
            try:
                scored = task.score(item, result)
                scores, extracted, target = dict(scored.scores), dict(scored.extracted), scored.target
                meta.update(scored.meta)
                error = None if (bad := first_non_finite(scores)) is None else f"score: {bad}"
            except Exception as exc:  # noqa: BLE001 - recorded as this sample's error
                error = f"score: {type(exc).__name__}: {exc}"
            if error is None:
                fields["truncated"] = is_truncated(result.finish_reason, split, extracted)
            else:
                scores, extracted = {}, {}
        fields["reference_logprobs"], ref_meta = record_fields(reference)
        meta.update(ref_meta)
        return SampleRecord(task=task.name, task_version=task.version, arm=self.arm, item_id=item.item_id,
                            cluster=item.cluster, prompt_hash=turn.prompt_hash, target=target,
                            target_hash=sha256_text(target) if target is not None else None, extracted=extracted,
                            scores=scores, error=error, meta=meta, **fields)


def _warm_up(server: _Server, context: str, template: base.GenerateRequest) -> None:
    """Serve a session's shared context once (one token, not recorded) so turn 1 finds it cached."""
    _call(server.engine.generate, [replace(template, prompt=context, max_tokens=1, until=())])


def _path_meta(before: PrefixCacheStats, after: PrefixCacheStats) -> Meta:
    return _delta(before, after, "path")


def run_sessions(engine: Engine, task: SessionTask, *, arm: str, out_path: Path, limit: int | None = None,
                 repeats: int = 1, seed: int = 0, data_dir: Path | None = None, progress: bool = True) -> RunSummary:
    """Serve every session of `task` cold, warm and shuffled on `engine` as arm `arm`, appending one record
    per turn and path to `out_path` (records already there are kept: resume); `progress` as evals.run.runner's."""
    start = time.perf_counter()
    if repeats != 1:
        raise EvalError(f"{task.name}: repeats = {repeats}; the task runs each turn once per path (add sessions)")
    items = task.items(data_dir)
    if limit is not None and limit < len(items):
        raise EvalError(f"{task.name}: limit {limit} would cut sessions apart ({len(items)} turn-paths); leave limit "
                        "unset and size the probe with the sessions and turns options")
    reused = any(p != "cold" for p in task.path_names())  # warm and shuffled read (or reset) the prefix cache
    control: PrefixCacheControl = (require_prefix_cache(engine, task.name) if reused
                                   else prefix_cache_of(engine) or _NoCache())  # type: ignore[assignment]
    check_fits(engine, task, items)
    missing_samples(task, arm=arm, path=out_path, seed=seed, data_dir=data_dir)  # refuses foreign records
    server = _Server(engine, control, task, arm)
    turns = {}
    for it in items:
        req = task.request(it, repeat=0, seed=sample_seed(seed, task.name, it.item_id.rsplit("/", 1)[0], 0))
        assert isinstance(req, base.GenerateRequest)
        turns[it.item_id] = _Turn(it, req, sha256_text(task.prompt_text(req)), req.seed or 0)
    by_session: dict[str, dict[str, list[_Turn]]] = {}
    for t in turns.values():
        by_session.setdefault(t.item.doc["session"], {}).setdefault(t.item.doc["path"], []).append(t)
    written = errors = tokens = 0
    with RecordWriter(out_path) as writer, ExitStack() as shown:
        done = {key for key, _ in writer.done}
        skipped = len(done & set(turns))
        bar = shown.enter_context(task_progress(f"{arm}/{task.name}", len(turns) - skipped, settings_from_env(progress)))

        def write(turn: _Turn, answer: tuple[Any, Any, Meta], extra: Meta) -> None:
            nonlocal written, errors, tokens
            if turn.item.item_id in done:
                return
            rec = server.record(turn, answer[0], answer[1], {**answer[2], **extra})
            writer.write(rec)
            done.add(turn.item.item_id)
            written, errors, tokens = written + 1, errors + (rec.error is not None), tokens + (rec.output_tokens or 0)
            bar.advance(1)

        for session, paths in by_session.items():
            for t in paths.get("cold", []):
                if t.item.item_id not in done:
                    before = _stats(control)
                    [answer] = server.serve([t], reset=True)
                    write(t, answer, _path_meta(before, _stats(control)))
            warm = paths.get("warm", [])
            if any(t.item.item_id not in done for t in warm):
                control.reset_prefix_cache()
                before = _stats(control)
                _warm_up(server, task.session_context(warm[0].item), warm[0].request)
                answers = [server.serve([t], reset=False)[0] for t in warm]
                path = _path_meta(before, _stats(control))
                for t, answer in zip(warm, answers, strict=True):
                    write(t, answer, path)
            log.info("%s/%s: session %s served (%d records so far)", arm, task.name, session, written)
        for k, name in enumerate(p for p in task.path_names() if p.startswith("shuffled")):
            order = [t for paths in by_session.values() for t in paths[name]]
            random.Random(f"{task.seed}/shuffle/{k}").shuffle(order)
            for lo in range(0, len(order), task.shuffle_batch):
                batch = order[lo : lo + task.shuffle_batch]
                if all(t.item.item_id in done for t in batch):
                    continue
                before = _stats(control)
                answers = server.serve(batch, reset=True)
                path = _path_meta(before, _stats(control))
                for t, answer in zip(batch, answers, strict=True):
                    write(t, answer, {**path, "shuffle": k + 1})
    if errors:
        log.warning("%s/%s: %d of %d samples failed (recorded with their errors)", arm, task.name, errors, written)
    return RunSummary(task=task.name, arm=arm, path=out_path, items=len(items), samples=len(items), skipped=skipped,
                      written=written, errors=errors, seconds=time.perf_counter() - start, output_tokens=tokens)
