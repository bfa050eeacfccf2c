"""Run one task on one engine for one arm: items -> requests -> engine -> scores -> SampleRecords.

Records are appended and flushed per finished sample (RecordWriter), so a killed run resumes where
it stopped: a rerun skips the (item, repeat) keys already on disk and never writes one twice (a
partly written chunk is re-run whole, so every batch is the one an uninterrupted run makes). The
records already on disk must have been made by the same task, version and prompts (the prompt hash
of every finished sample is recomputed and compared) and must all lie inside this run's selection;
otherwise the run refuses with a RecordError before it writes anything.

A sample that fails (the engine answered base.Failure, or scoring raised) is recorded with its error and
no scores; it is never dropped and never scored as wrong. A generation is split into reasoning and
answer at the task's think tags (evals.prompts.reasoning); only the answer is scored, and a sample that hit
max_tokens before its answer is recorded as truncated (its score is kept as the task scores it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from evals.engines import base
from evals.engines.base import Engine, TokenLogprobs
from evals.errors import EngineError, EvalError
from evals.prompts.reasoning import ThinkSplit, is_truncated, split_reasoning, think_tags
from evals.records.samples import RecordWriter, SampleRecord, first_non_finite, sha256_text
from evals.run.progress import settings_from_env, task_progress
from evals.run.reference import ReferenceResult, chunk_references, has_reference, record_fields
from evals.run.resume import (  # noqa: F401 - REQUEST_TYPES, RESUME_RECORDS_HINT, missing_samples: re-exported
    REQUEST_TYPES,
    RESUME_RECORDS_HINT,
    RunSummary,
    Sample,
    build_samples,
    check_existing,
    missing_samples,
)
from evals.run.selection import select_items
from evals.run.sessions import run_sessions
from evals.tasks.base import RepeatScored, Request, Result, ServedInSessions, Task

log = logging.getLogger(__name__)

DEFAULT_CHUNK = 64  # samples per engine call: the engine batches inside it; records flush after it


def _call_engine(engine: Engine, kind: str, requests: list[Request]) -> list[Result | base.Failure]:
    """One batched engine call for requests of one kind; results in request order."""
    if kind == "generate":
        results: list = engine.generate(requests)  # type: ignore[arg-type]
    elif kind == "loglikelihood":
        results = engine.loglikelihood(requests)  # type: ignore[arg-type]
    else:
        results = engine.token_logprobs(requests)  # type: ignore[arg-type]
    if len(results) != len(requests):
        raise EngineError(f"engine {engine.info.name!r} returned {len(results)} results for {len(requests)} requests")
    return results


def _record(task: Task, arm: str, sample: Sample, result: Result | base.Failure | None, error: str | None,
            reference: ReferenceResult | None = None) -> SampleRecord:
    """The SampleRecord of one finished sample; a failed one has its error and no scores. A generation
    is split into reasoning and answer (evals.prompts.reasoning); only the answer is scored. `reference`: the
    sample's reference-answer log-probs (evals.run.reference), kept whatever the sample scored."""
    meta: dict[str, str | int | float | bool | None] = {}
    if isinstance(sample.request, base.GenerateRequest) and sample.request.temperature > 0:
        meta["sample_seed"] = sample.seed
    fields: dict = {}
    split: ThinkSplit | None = None
    if isinstance(result, base.GenerateResult):
        prompt = sample.request.prompt if isinstance(sample.request, base.GenerateRequest) else ""
        split = split_reasoning(result.text, think_tags(task), prompt=prompt, server_reasoning=result.reasoning)
        # only the final answer is scored; the reasoning is recorded beside it
        result = replace(result, text=split.answer, reasoning=split.reasoning)
        fields = {"completion": split.answer, "reasoning": split.reasoning, "output_tokens": result.output_tokens,
                  "finish_reason": result.finish_reason}
    elif isinstance(result, base.LoglikelihoodResult):
        fields = {"choice_loglikelihoods": list(result.loglikelihoods), "choice_is_greedy": list(result.is_greedy)}
    elif isinstance(result, TokenLogprobs):
        fields = {"token_logprobs": result}
    if isinstance(result, base.Failure):
        error = f"engine: {result.error}"
    scores: dict[str, float | None] = {}
    extracted: dict[str, str | None] = {}
    target: str | None = None
    if error is None and result is not None:
        try:
            scored = (task.score_repeat(sample.item, result, sample.repeat) if isinstance(task, RepeatScored)
                      else task.score(sample.item, result))  # type: ignore[arg-type]
            scores, extracted, target = dict(scored.scores), dict(scored.extracted), scored.target
            meta.update(scored.meta)
        except Exception as exc:  # noqa: BLE001 - recorded as this sample's error
            error = f"score: {type(exc).__name__}: {exc}"
        else:
            problem = first_non_finite(scores)  # NaN/inf: this sample's error, with a warning
            if problem is not None:
                log.warning("%s/%s item %r repeat %d: %s; recorded as an errored sample",
                            arm, task.name, sample.item.item_id, sample.repeat, problem)
                error = f"score: {problem}"
    if error is not None:
        scores, extracted = {}, {}
    elif split is not None and isinstance(result, base.GenerateResult):
        fields["truncated"] = is_truncated(result.finish_reason, split, extracted)
    fields["reference_logprobs"], reference_meta = record_fields(reference)
    meta.update(reference_meta)
    return SampleRecord(
        task=task.name, task_version=task.version, arm=arm, item_id=sample.item.item_id, repeat=sample.repeat,
        cluster=sample.item.cluster, prompt_hash=sample.prompt_hash, target=target,
        target_hash=sha256_text(target) if target is not None else None, extracted=extracted, scores=scores,
        error=error, meta=meta, **fields,
    )


def run_task(engine: Engine, task: Task, *, arm: str, out_path: Path, limit: int | None = None, repeats: int = 1,
             seed: int = 0, data_dir: Path | None = None, chunk: int = DEFAULT_CHUNK,
             progress: bool = True, blocks: Sequence[int] | None = None, reference: bool = True) -> RunSummary:
    """Run `task` on `engine` as arm `arm`, appending one record per (item, repeat) to `out_path`.

    `limit` keeps a seeded random subset (the same items in every arm), `repeats` samples each item
    that many times with per-repeat seeds; samples already in `out_path` are skipped (resume).
    `blocks` (a sequential run's cumulative item counts) runs only the first blocks[-1] items of the
    selection in its seeded order (select_items), each block [blocks[k-1], blocks[k]) chunked alone.
    `reference`: also teacher-force each chunk's reference answers (a task with one, evals.run.reference)."""
    if repeats < 1:
        raise EvalError(f"repeats must be >= 1, got {repeats}")
    if chunk < 1:
        raise EvalError(f"chunk must be >= 1, got {chunk}")
    if isinstance(task, ServedInSessions):  # the cache-path probe serves its own order (evals.run.sessions)
        if blocks is not None:
            raise EvalError("sessions: sequential looks do not apply to the cache-path probe; run it unsequenced")
        return run_sessions(engine, task, arm=arm, out_path=out_path, limit=limit,  # type: ignore[arg-type]
                            repeats=repeats, seed=seed, data_dir=data_dir, progress=progress)
    start = time.perf_counter()
    shown = settings_from_env(progress)
    items = select_items(task.items(data_dir), limit, seed)
    samples = build_samples(task, items, repeats, seed)
    check_existing(out_path, task, arm, samples)
    written = errors = tokens = 0
    with RecordWriter(out_path) as writer:
        done = writer.done
        skipped = sum((s.item.item_id, s.repeat) in done for s in samples)
        # Chunks are cut from the whole selection, not from what is left: a resumed run re-runs a
        # partly written chunk whole (writing only its missing samples) so every engine call, and
        # so every batch, is the one an uninterrupted run makes: batch composition changes floats.
        parts = [samples[lo : lo + chunk] for lo in range(0, len(samples), chunk)]
        if blocks is not None:  # batches are a function of the block sizes, so a resumed run makes the same
            parts, seen = [], set()
            for n in blocks:
                ids = {it.item_id for it in select_items(items, n, seed)} - seen
                seen |= ids
                block = [s for s in samples if s.item.item_id in ids]
                parts += [block[lo : lo + chunk] for lo in range(0, len(block), chunk)]
        todo = sum((s.item.item_id, s.repeat) not in done for part in parts for s in part)
        with task_progress(f"{arm}/{task.name}", todo, shown) as bar:
            for part in parts:
                if all((s.item.item_id, s.repeat) in done for s in part):
                    continue
                runnable = [s for s in part if s.request is not None]
                results: dict[int, Result | base.Failure] = {}
                if runnable:
                    try:
                        answers = _call_engine(engine, task.kind, [s.request for s in runnable])  # type: ignore[misc]
                    except EvalError:
                        raise
                    except Exception as exc:  # noqa: BLE001 - the whole call failed: every sample records it
                        answers = [base.Failure(f"{type(exc).__name__}: {exc}")] * len(runnable)
                    results = {id(s): a for s, a in zip(runnable, answers, strict=True)}
                refs: dict[int, ReferenceResult | None] = {}
                if reference and has_reference(task) and runnable:  # the same prompts, after the task's own call
                    pairs = [(s.item, s.request) for s in runnable]
                    refs = dict(zip(map(id, runnable), chunk_references(engine, task, pairs), strict=True))  # type: ignore[arg-type]
                fresh = [s for s in part if (s.item.item_id, s.repeat) not in done]
                for s in fresh:
                    rec = _record(task, arm, s, results.get(id(s)), s.error, refs.get(id(s)))
                    writer.write(rec)
                    written += 1
                    errors += rec.error is not None
                    tokens += rec.output_tokens or 0
                bar.advance(len(fresh))
    if errors:
        log.warning("%s/%s: %d of %d samples failed (recorded with their errors)", arm, task.name, errors, written)
    return RunSummary(task=task.name, arm=arm, path=out_path, items=len(items), samples=len(samples),
                      skipped=skipped, written=written, errors=errors, seconds=time.perf_counter() - start,
                      output_tokens=tokens)
