"""Reference answers: each task's reference continuation, the engines scoring a continuation given its
context (hf against its own log-likelihood, the openai engine against a scripted echo server, "not
available" without echo), the runner's one extra call per chunk (repeats scored once, off with
reference = False, resume without re-running), and that no GPQA text reaches a record."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from evals.engines import base as engine_base
from evals.engines.base import TokenLogprobs
from evals.engines.hf.engine import HFEngine
from evals.engines.lmeval_tokens import encode_pair
from evals.errors import EvalError
from evals.records.samples import read_records
from evals.run.reference import META_KEY, REFERENCE_TOP_K, chunk_references, has_reference, reference_request
from evals.run.runner import run_task
from evals.tasks import get_task
from evals.tasks.base import Item, Request, Result, Scored, TaskOptions
from tests.evals.engines.openai_api.fake_server import CharTokenizer, FakeServer, engine_at
from tests.evals.hf_fixtures import tiny_engine
from tests.shared_data import shared_data_dir

# ----------------------------------------------------------------------------- task references


def _first(name: str, options: TaskOptions | None = None, data: str = "") -> tuple[object, Item, Request]:
    task = get_task(name, options or TaskOptions())
    item = task.items(shared_data_dir(data))[0]
    return task, item, task.request(item, repeat=0, seed=0)


def test_gsm8k_reference_is_lm_evals_target_after_the_prompt() -> None:
    task, item, req = _first("gsm8k", TaskOptions(num_fewshot=2), "gsm8k")
    assert isinstance(req, engine_base.GenerateRequest) and req.prompt.endswith("Answer:")
    assert task.reference(item) == " " + item.doc["answer"]  # the worked solution, "#### N" included
    cot, item2, _ = _first("gsm8k_cot_llama", TaskOptions(num_fewshot=0), "gsm8k")
    assert cot.reference(item2) == item2.doc["answer"].split("####")[-1].strip()  # its target: the number
    rq = reference_request(task, item, req)
    assert rq is not None and rq.context == req.prompt and rq.top_k == REFERENCE_TOP_K


@pytest.mark.parametrize("name", ["arc_challenge", "mmlu", "truthfulqa_mc1", "gpqa_diamond_zeroshot", "lambada_openai"])
def test_multiple_choice_reference_is_the_gold_continuation_the_request_scores(name: str) -> None:
    task, item, req = _first(name)
    assert isinstance(req, engine_base.LoglikelihoodRequest)
    ref = task.reference(item)
    assert ref in req.continuations and ref.startswith(" ")
    if hasattr(task, "gold_index"):
        choices = task.doc_to_choice(item.doc)
        assert req.continuations.index(ref) == task.gold_index(item.doc, choices)
    assert reference_request(task, item, req).context == req.context  # type: ignore[union-attr]


def test_winogrande_reference_follows_the_gold_options_context() -> None:
    task, item, req = _first("winogrande")
    assert isinstance(req, engine_base.LoglikelihoodRequest)
    gold = {"1": 0, "2": 1}[item.doc["answer"]]
    rq = reference_request(task, item, req)
    assert rq is not None and rq.context == req.contexts[gold] and rq.text == req.continuations[gold]


def test_math500_needle_and_gpqa_cot_references() -> None:
    task, item, _ = _first("math500", data="math500")
    assert task.reference(item) == " " + item.doc["solution"]
    needle = get_task("needle", TaskOptions(extra={"lengths": [128], "depths": [0.5], "per_cell": 1}))
    it = needle.items(None)[0]
    assert needle.reference(it) == " " + it.doc["value"]
    cot, item3, req3 = _first("gpqa_diamond_cot_zeroshot")
    ref = cot.reference(item3)
    assert ref.startswith(item3.doc["answer"] + " ") and req3.prompt.endswith(": ")  # type: ignore[union-attr]


def test_tasks_without_a_reference_refuse_reference_signal_false() -> None:
    assert not has_reference(get_task("wikitext_kl"))
    assert not has_reference(get_task("gpqa_diamond_cot_modelcard"))  # prompt shuffled per repeat
    with pytest.raises(EvalError, match="reference_signal = false is not read"):
        get_task("wikitext_kl", TaskOptions(reference_signal=False))
    assert has_reference(get_task("gsm8k", TaskOptions(reference_signal=False)))


# ----------------------------------------------------------------------------- engines


@pytest.fixture(scope="module")
def engine() -> Iterator[HFEngine]:
    eng = tiny_engine()
    yield eng
    eng.close()


PAIRS = [("Question: what is 2 + 3? Answer:", " 5."), ("Once upon a time ", "there was a town"), ("T", "he quick fox")]


def test_hf_continuation_logprobs_sum_to_its_loglikelihood(engine: HFEngine) -> None:
    reqs = [engine_base.TokenLogprobsRequest(text=t, context=c, top_k=5) for c, t in PAIRS]
    got = engine.token_logprobs(reqs)
    lls = engine.loglikelihood([engine_base.LoglikelihoodRequest(context=c, continuations=(t,)) for c, t in PAIRS])
    for (context, text), tl, ll in zip(PAIRS, got, lls, strict=True):
        assert isinstance(tl, TokenLogprobs) and isinstance(ll, engine_base.LoglikelihoodResult)
        _, cont = encode_pair(engine.hf.tokens, context, text)  # "Once upon a time " gives its space to the text
        assert tl.target_ids == cont
        assert sum(tl.target_logprobs) == pytest.approx(ll.loglikelihoods[0], abs=1e-4)
        assert all(len(k) == 5 and k == sorted(k, reverse=True) for k in tl.topk_logprobs)
        assert all(lp <= top[0] + 1e-6 for lp, top in zip(tl.target_logprobs, tl.topk_logprobs, strict=True))
    [plain] = engine.token_logprobs([engine_base.TokenLogprobsRequest(text="The quick brown fox", context="")])
    assert isinstance(plain, TokenLogprobs)  # no context: the text alone, from its second token (wikitext_kl)
    assert plain.target_ids == engine.hf.tokens.encode("The quick brown fox")[1:]


def test_hf_caps_the_continuation_and_cuts_a_long_context_from_the_left(engine: HFEngine) -> None:
    context = "Question: what is 2 + 3? Answer:" * 40
    assert len(engine.hf.tokens.encode(context)) > engine.max_length
    capped, long = engine.token_logprobs([
        engine_base.TokenLogprobsRequest(text=" the people there liked bread", context="Once", max_tokens=3),
        engine_base.TokenLogprobsRequest(text=" 5.", context=context),
    ])
    assert isinstance(capped, TokenLogprobs) and len(capped.target_ids) == 3
    assert isinstance(long, TokenLogprobs) and long.target_ids == encode_pair(engine.hf.tokens, context, " 5.")[1]
    [empty] = engine.token_logprobs([engine_base.TokenLogprobsRequest(text="", context="Once")])
    assert isinstance(empty, engine_base.Failure)


def test_openai_scores_the_continuation_from_the_echo_and_is_not_available_without(tmp_path: Path) -> None:
    tok = CharTokenizer()
    for mode in ("echo", "noecho"):
        (tmp_path / mode).mkdir()
        server = FakeServer(tmp_path / mode, mode)
        server.start()
        try:
            eng = engine_at(server.base_url, tokenizer=tok)
            [res] = eng.token_logprobs([engine_base.TokenLogprobsRequest(text=" 5.", context="Q: 2+3? A:", top_k=2)])
            if mode == "echo":
                n_ctx = len("Q: 2+3? A:")
                assert isinstance(res, TokenLogprobs) and res.target_ids == [ord(c) for c in " 5."]
                assert res.target_logprobs == pytest.approx([-p / 10 for p in range(n_ctx, n_ctx + 3)])
            else:  # llama.cpp ignores echo: the reference is "not available", the task still runs
                assert isinstance(res, engine_base.Failure) and res.error.startswith("not available")
            eng.close()
        finally:
            server.stop()


# ----------------------------------------------------------------------------- runner


@dataclass(frozen=True)
class RefTask:
    """Six arithmetic prompts whose reference is the right answer; greedy generation of 3 tokens."""

    name: str = "ref_echo"
    version: str = "1"
    kind: str = "generate"
    fail_reference: tuple[str, ...] = field(default=())

    def items(self, data_dir: Path | None) -> list[Item]:
        return [Item(item_id=f"q{i}", doc={"q": f"Question: what is {i} + 3? Answer:", "a": f" {i + 3}."})
                for i in range(6)]

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        return engine_base.GenerateRequest(prompt=item.doc["q"], max_tokens=3)

    def prompt_text(self, request: Request) -> str:
        return request.prompt  # type: ignore[union-attr]

    def score(self, item: Item, result: Result) -> Scored:
        return Scored(scores={"exact_match,none": 0.0})

    def reference(self, item: Item) -> str:
        if item.item_id in self.fail_reference:
            raise KeyError("no reference for this one")
        return item.doc["a"]


class Counting:
    """An engine that counts the reference requests it is sent (or answers them with `answer`)."""

    def __init__(self, inner: HFEngine, answer: engine_base.Failure | Exception | None = None) -> None:
        self.inner, self.answer, self.sent = inner, answer, []
        self.info = inner.info

    def generate(self, requests):
        return self.inner.generate(requests)

    def loglikelihood(self, requests):
        return self.inner.loglikelihood(requests)

    def token_logprobs(self, requests):
        self.sent.append(len(requests))
        if isinstance(self.answer, Exception):
            raise self.answer
        if self.answer is not None:
            return [self.answer] * len(requests)
        return self.inner.token_logprobs(requests)

    def close(self) -> None:
        pass


def test_runner_stores_each_samples_reference_once_per_unique_prompt(engine: HFEngine, tmp_path: Path) -> None:
    counting = Counting(engine)
    summary = run_task(counting, RefTask(), arm="base", out_path=tmp_path / "r.jsonl", repeats=2, chunk=4,
                       progress=False)
    recs = read_records(tmp_path / "r.jsonl")
    assert summary.written == 12 and counting.sent == [2, 2, 2]  # chunks of 4 samples = 2 items x 2 repeats
    direct = engine.token_logprobs([engine_base.TokenLogprobsRequest(text=" 3.", context="Question: what is 0 + 3? Answer:")])
    by_key = {r.key: r for r in recs}
    stored = by_key[("q0", 0)].reference_logprobs
    assert stored is not None and stored == by_key[("q0", 1)].reference_logprobs  # one pass serves both repeats
    # the same numbers as a request of its own (to float32 rounding: a batch of two is not bit-equal to one on
    # every CPU; seen on a machine without AVX-512)
    assert (stored.target_ids, stored.topk_ids) == (direct[0].target_ids, direct[0].topk_ids)
    assert stored.target_logprobs == pytest.approx(direct[0].target_logprobs, abs=1e-5)
    assert [x for row in stored.topk_logprobs for x in row] == pytest.approx(
        [x for row in direct[0].topk_logprobs for x in row], abs=1e-5)
    assert all(r.reference_logprobs is not None and r.completion is not None for r in recs)


def test_reference_signal_off_and_resume_does_not_rerun_old_records(engine: HFEngine, tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    counting = Counting(engine)
    run_task(counting, RefTask(), arm="base", out_path=path, limit=4, progress=False, reference=False)
    before = path.read_bytes()
    assert counting.sent == [] and all(r.reference_logprobs is None for r in read_records(path))
    again = run_task(counting, RefTask(), arm="base", out_path=path, limit=4, progress=False)
    assert again.written == 0 and counting.sent == [] and path.read_bytes() == before


def test_a_reference_that_cannot_be_scored_is_recorded_and_the_sample_stands(engine: HFEngine, tmp_path: Path) -> None:
    for name, answer in (("na", engine_base.Failure("not available: no echo")), ("boom", RuntimeError("kaput"))):
        path = tmp_path / f"{name}.jsonl"
        run_task(Counting(engine, answer), RefTask(fail_reference=("q1",)), arm="a", out_path=path, progress=False)
        recs = {r.item_id: r for r in read_records(path)}
        assert all(r.error is None and r.scores and r.reference_logprobs is None for r in recs.values())
        assert recs["q1"].meta[META_KEY].startswith("reference: KeyError")
        assert str(recs["q0"].meta[META_KEY]).startswith("not available")


def test_chunk_references_keeps_order_and_skips_items_without_one(engine: HFEngine) -> None:
    task = RefTask()
    items = task.items(None)
    pairs = [(it, task.request(it, repeat=0, seed=0)) for it in items[:3]]
    out = chunk_references(engine, task, [pairs[2], pairs[0], pairs[2]])
    assert isinstance(out[0], TokenLogprobs) and out[0] == out[2] != out[1]


# ----------------------------------------------------------------------------- GPQA stays unseen


def test_gpqa_reference_writes_token_ids_and_log_probs_only(engine: HFEngine, tmp_path: Path) -> None:
    data = shared_data_dir("gpqa")
    for name in ("gpqa_diamond_zeroshot", "gpqa_diamond_cot_zeroshot"):
        opts = TaskOptions(max_tokens=2) if "cot" in name else TaskOptions()
        task = get_task(name, opts)
        items = task.items(data)
        path = tmp_path / f"{name}.jsonl"
        run_task(engine, task, arm="a", out_path=path, limit=2, seed=3, data_dir=data, progress=False)
        recs = read_records(path)
        assert len(recs) == 2 and all(r.reference_logprobs is not None for r in recs)
        text = path.read_text(encoding="utf-8")
        by_id = {it.item_id: it for it in items}
        for r in recs:
            doc = by_id[r.item_id].doc
            for secret in (doc["Question"], doc["Correct Answer"]):  # as written, and as JSON escapes it
                assert secret.strip()[:40] not in text and json.dumps(secret.strip())[1:41] not in text
