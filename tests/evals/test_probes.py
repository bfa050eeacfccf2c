"""The two probes lm-eval lacks: wikitext_kl (teacher-forced WikiText-2 chunks) and needle (seeded
long-context key-value retrieval)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.engines.base import GenerateRequest, GenerateResult, TokenLogprobs, TokenLogprobsRequest
from evals.errors import EvalError
from evals.tasks import get_task
from evals.tasks.base import TaskOptions
from evals.tasks.needle import CHARS_PER_TOKEN, INSTRUCTION, NeedleTask, first_number
from evals.tasks.wikitext_kl import chunk_scores, lm_eval_detokenizer, pack_lines, split_articles
from tests.shared_data import shared_data_dir


def _data_dir() -> Path:
    return shared_data_dir("wikitext2/derived/wiki.test.raw")


# ------------------------------------------------------------------------------------ wikitext_kl


def test_split_articles_starts_at_top_level_headings_only() -> None:
    rows = [{"text": ""}, {"text": " = A = \n"}, {"text": ""}, {"text": " a1 \n"}, {"text": " = = Sub = = \n"},
            {"text": " a2 \n"}, {"text": " = B = \n"}, {"text": " b1 \n"}]
    assert split_articles(rows) == [[" = A = \n", " a1 \n", " = = Sub = = \n", " a2 \n"], [" = B = \n", " b1 \n"]]


def test_pack_lines_keeps_whole_lines_under_the_budget() -> None:
    assert pack_lines(["aaaa", "bbb", "cc", "dddddddd", "e"], 7) == ["aaaabbb", "cc", "dddddddd", "e"]
    assert pack_lines([], 7) == []


def test_chunk_scores_hand_computed() -> None:
    tl = TokenLogprobs(target_ids=[5, 6, 7, 8], target_logprobs=[-0.5, -1.0, -2.0, -0.5],
                       topk_ids=[[5, 1], [2, 6], [7, 0], [8, 9]], topk_logprobs=[[-0.5, -1], [-0.9, -1.0], [-2, -3], [-0.5, -2]])
    assert chunk_scores(tl) == {"nll,none": pytest.approx(1.0), "top1_acc,none": 0.75}


def test_wikitext_items_from_the_real_test_split() -> None:
    task = get_task("wikitext_kl")
    items = task.items(_data_dir())
    assert task.kind == "token_logprobs"
    ids = [it.item_id for it in items]
    assert len(ids) == len(set(ids)) > 500
    assert len({it.cluster for it in items}) == 62  # WikiText-2 test: 62 top-level articles
    assert items[0].item_id == "000.000" and items[0].cluster == "article-000"
    assert items[0].doc["text"].startswith(" = Robert Boulter =\nRobert Boulter is an English film, television")
    assert all(" @-@ " not in it.doc["text"] and " , " not in it.doc["text"] for it in items)  # detokenized
    req = task.request(items[3], repeat=0, seed=0)
    assert req == TokenLogprobsRequest(text=items[3].doc["text"], top_k=20, max_tokens=512)
    assert task.items(_data_dir()) == items  # stable


def test_the_detokenizer_is_lm_evals_own_function() -> None:
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer  # lm-eval's, by module name

    ours = lm_eval_detokenizer()
    assert ours.__code__.co_code == wikitext_detokenizer.__code__.co_code  # the same file's function
    page = " = A = \n 3 @,@ 000 km @-@ long ( n.b. ) ; it 's \" quoted \" , isn 't it ? \n"
    assert ours({"page": page}) == wikitext_detokenizer({"page": page}) != page


def test_wikitext_options_are_validated() -> None:
    task = get_task("wikitext_kl", TaskOptions(extra={"top_k": 5, "chunk_chars": 500}))
    assert (task.top_k, task.chunk_chars) == (5, 500)  # type: ignore[attr-defined]
    with pytest.raises(EvalError, match="unknown option"):
        get_task("wikitext_kl", TaskOptions(extra={"topk": 5}))
    with pytest.raises(EvalError, match="top_k"):
        get_task("wikitext_kl", TaskOptions(extra={"top_k": 0}))
    with pytest.raises(EvalError, match="num_fewshot"):
        get_task("wikitext_kl", TaskOptions(num_fewshot=5))


def test_wikitext_through_the_hf_engine(tmp_path: Path) -> None:
    from evals.records.samples import read_records
    from evals.run.runner import run_task
    from tests.evals.hf_fixtures import tiny_engine

    task = get_task("wikitext_kl", TaskOptions(extra={"top_k": 4, "max_tokens": 32}))
    path = tmp_path / "w.jsonl"
    run_task(tiny_engine(), task, arm="a", out_path=path, limit=3, data_dir=_data_dir(), progress=False)
    recs = read_records(path)
    assert len(recs) == 3
    for rec in recs:
        assert rec.error is None and rec.token_logprobs is not None
        assert len(rec.token_logprobs.target_ids) == 31 and all(len(k) == 4 for k in rec.token_logprobs.topk_ids)
        assert rec.cluster and rec.item_id.startswith(rec.cluster.removeprefix("article-"))
        assert rec.scores["nll,none"] == pytest.approx(-sum(rec.token_logprobs.target_logprobs) / 31)


# ------------------------------------------------------------------------------------ needle


def test_needle_items_are_seeded_and_cover_the_grid() -> None:
    task = NeedleTask(lengths=(200, 600), depths=(0.0, 0.5, 1.0), per_cell=3)
    items = task.items(None)
    assert len(items) == 2 * 3 * 3
    assert items == task.items(None)  # same seed, same haystacks
    assert [it.doc["value"] for it in NeedleTask(lengths=(200, 600), depths=(0.0, 0.5, 1.0), per_cell=3,
                                                 seed=1).items(None)] != [it.doc["value"] for it in items]
    assert {it.cluster for it in items} == {f"L{n}-d{d:.2f}" for n in (200, 600) for d in (0.0, 0.5, 1.0)}
    assert len({it.item_id for it in items}) == len(items)
    for it in items:
        ctx, key, value = it.doc["context"], it.doc["key"], it.doc["value"]
        needle = f"One of the special magic numbers for {key} is: {value}."
        assert ctx.count(needle) == 1 and len(value) == 7
        where = ctx.index(needle) / len(ctx)
        assert abs(where - it.doc["depth"]) < 0.1  # placed at its depth
        # approximate length: within 25% of length * CHARS_PER_TOKEN characters
        assert abs(len(INSTRUCTION + ctx) - it.doc["length"] * CHARS_PER_TOKEN) < 0.25 * it.doc["length"] * CHARS_PER_TOKEN


def test_needle_distractors_have_other_keys() -> None:
    [item] = NeedleTask(lengths=(300,), depths=(0.5,), per_cell=1, distractors=3).items(None)
    ctx = item.doc["context"]
    assert ctx.count("One of the special magic numbers for") == 4
    assert ctx.count(f"for {item.doc['key']} is:") == 1


def test_needle_request_and_score() -> None:
    task = NeedleTask(lengths=(200,), depths=(0.5,), per_cell=1)
    [item] = task.items(None)
    req = task.request(item, repeat=0, seed=9)
    assert isinstance(req, GenerateRequest) and req.until == ("\n",) and req.seed is None
    assert req.prompt.endswith(f"The special magic number for {item.doc['key']} mentioned in the provided text is")
    value = item.doc["value"]
    assert task.score(item, GenerateResult(f" {value}.", 3, "stop")).scores == {"exact_match,first-number": 1.0}
    assert task.score(item, GenerateResult(f" {value}1", 3, "stop")).scores == {"exact_match,first-number": 0.0}
    assert task.score(item, GenerateResult(" none", 1, "stop")).extracted == {"first-number": None}
    assert first_number("is: 12 and 34") == "12"


def test_needle_options_are_validated() -> None:
    task = get_task("needle", TaskOptions(extra={"lengths": [512, 1024], "depths": [0, 1]}, temperature=0.5))
    assert task.lengths == (512, 1024) and task.depths == (0.0, 1.0)  # type: ignore[attr-defined]
    assert task.request(task.items(None)[0], repeat=0, seed=11).seed == 11  # sampled: per-sample seed
    for bad in ({"lengths": []}, {"lengths": [10]}, {"depths": [1.5]}, {"per_cell": 0}, {"needles": 2}):
        with pytest.raises(EvalError, match="needle"):
            get_task("needle", TaskOptions(extra=bad))


@pytest.mark.slow
def test_smollm2_finds_short_needles() -> None:
    """The probe is usable: the real model retrieves the value at short lengths (baseline accuracy 1)."""
    from evals.engines import build_engine
    from tests.evals.hf_fixtures import smollm2_or_skip

    engine = build_engine("hf", smollm2_or_skip(), {"batch_size": 4})
    task = NeedleTask(lengths=(256,), depths=(0.0, 1.0), per_cell=2)
    items = task.items(None)
    results = engine.generate([task.request(it, repeat=0, seed=0) for it in items])
    scores = [task.score(it, r).scores["exact_match,first-number"] for it, r in zip(items, results, strict=True)]
    assert scores == [1.0] * 4
