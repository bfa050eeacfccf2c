"""The reference-answer signal of one chunk of samples: each sample's reference answer (the task's
`reference(item)`, see evals.tasks.base.WithReference) teacher-forced after the prompt the task sent for
it, in one `token_logprobs` call; the runner stores the result in SampleRecord.reference_logprobs.

The context is the prompt as sent (a generation prompt or a log-likelihood context, chat-rendered
where chat is on; a task's `reference_context` where the reference follows another one), and the
reference is scored as a log-likelihood continuation is (engines split the pair as lm-eval does).
Identical (context, reference) pairs of one chunk (the repeats of an item) are scored once. Only
token ids and log-probs are kept, never the text (GPQA's reference stays unseen). An engine that
cannot give prompt log-probs answers Failure ("not available"), recorded in the sample's meta; it
never fails the sample.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from evals.engines import base
from evals.engines.base import Engine, TokenLogprobs, TokenLogprobsRequest
from evals.errors import EvalError
from evals.tasks.base import Item, Request, Task, WithReference, WithReferenceContext

log = logging.getLogger(__name__)

REFERENCE_TOP_K = 20  # alternatives kept per position: the KL's top-k + tail bucket (as wikitext_kl)
REFERENCE_MAX_TOKENS = 512  # reference tokens scored per item (MATH-500's longest solutions are cut here)
META_KEY = "reference_error"  # SampleRecord.meta key of a reference the engine could not score
ReferenceResult = TokenLogprobs | base.Failure


def has_reference(task: Task) -> bool:
    """Whether the task defines a reference answer (its `reference` method)."""
    return isinstance(task, WithReference)


def request_context(task: Task, item: Item, request: Request) -> str:
    """The prompt the reference follows: the task's `reference_context`, else the request's own prompt
    (a generation's rendered prompt, a log-likelihood request's context)."""
    if isinstance(task, WithReferenceContext):
        return task.reference_context(item, request)
    if isinstance(request, base.GenerateRequest):
        return request.prompt
    if isinstance(request, base.LoglikelihoodRequest):
        return request.context
    raise EvalError(f"task {task.name!r}: a {type(request).__name__} has no prompt for a reference answer")


def reference_request(task: Task, item: Item, request: Request) -> TokenLogprobsRequest | None:
    """The teacher-forced request for one sample's reference (None: the item has none)."""
    if not isinstance(task, WithReference):
        raise EvalError(f"task {task.name!r} has no reference answer")
    text = task.reference(item)
    if not text:
        return None
    return TokenLogprobsRequest(text=text, top_k=REFERENCE_TOP_K, max_tokens=REFERENCE_MAX_TOKENS,
                                context=request_context(task, item, request))


def chunk_references(engine: Engine, task: Task, samples: Sequence[tuple[Item, Request]]) -> list[ReferenceResult | None]:
    """One result per sample, in order: its reference's log-probs, a Failure, or None (no reference).
    Building a request or the engine call failing answers Failure for the samples concerned."""
    out: list[ReferenceResult | None] = [None] * len(samples)
    unique: dict[tuple[str, str], int] = {}
    requests: list[TokenLogprobsRequest] = []
    slot: dict[int, int] = {}  # sample index -> request index
    for i, (item, request) in enumerate(samples):
        try:
            req = reference_request(task, item, request)
        except Exception as exc:  # noqa: BLE001 - this sample's reference only
            out[i] = base.Failure(f"reference: {type(exc).__name__}: {exc}")
            continue
        if req is None:
            continue
        key = (req.context, req.text)
        if key not in unique:
            unique[key] = len(requests)
            requests.append(req)
        slot[i] = unique[key]
    if not requests:
        return out
    try:
        results: list[ReferenceResult] = list(engine.token_logprobs(requests))
        if len(results) != len(requests):
            raise EvalError(f"{len(results)} results for {len(requests)} reference requests")
    except Exception as exc:  # noqa: BLE001 - the signal is beside the task: its samples still stand
        log.warning("%s: the reference-answer pass failed (%s: %s); recorded as not available",
                    task.name, type(exc).__name__, exc)
        results = [base.Failure(f"not available: {type(exc).__name__}: {exc}")] * len(requests)
    for i, j in slot.items():
        out[i] = results[j]
    return out


def record_fields(result: ReferenceResult | None) -> tuple[TokenLogprobs | None, dict[str, str]]:
    """(SampleRecord.reference_logprobs, meta entries) for one sample's reference result."""
    if isinstance(result, TokenLogprobs):
        return result, {}
    if isinstance(result, base.Failure):
        return None, {META_KEY: result.error}
    return None, {}
