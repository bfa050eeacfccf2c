"""qa.compare.pairing: joins on (task, item, repeat), one-line refusals, errors dropped from both arms."""

from __future__ import annotations

import numpy as np
import pytest

from evals.records.samples import SampleRecord
from qa.compare.pairing import (
    pair_records,
    paired_generation,
    paired_metric,
    paired_metrics,
    score_keys,
    split_key,
)
from qa.errors import PairingError


def rec(arm: str, item: str, repeat: int = 0, *, task: str = "t", scores: dict | None = None, prompt: str | None = None,
        cluster: str | None = None, version: str = "1", completion: str | None = None,
        extracted: dict | None = None, target_hash: str | None = None, error: str | None = None) -> SampleRecord:
    return SampleRecord(task=task, task_version=version, arm=arm, item_id=item, repeat=repeat,
                        prompt_hash=prompt or f"p{item}", cluster=cluster, completion=completion,
                        extracted=extracted or {}, scores=scores if scores is not None else {"acc,none": 1.0},
                        target_hash=target_hash, error=error)


def test_split_key() -> None:
    assert split_key("exact_match,strict-match") == ("exact_match", "strict-match")
    assert split_key("acc") == ("acc", "none")


def test_pairs_in_key_order_regardless_of_file_order() -> None:
    base = [rec("b", i) for i in ("3", "1", "2")]
    cand = [rec("c", i) for i in ("2", "3", "1")]
    (pt,) = pair_records(base, cand)
    assert [r.item_id for r in pt.baseline] == [r.item_id for r in pt.candidate] == ["1", "2", "3"]


def test_item_sets_differ_is_one_line_with_counts_and_ids() -> None:
    base = [rec("b", str(i)) for i in range(10)]
    cand = [rec("c", str(i)) for i in range(2, 14)]
    with pytest.raises(PairingError) as exc:
        pair_records(base, cand)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "10 baseline vs 12 candidate" in msg
    assert "2 only in baseline (0, 1)" in msg
    assert "4 only in candidate (10, 11, 12, ...)" in msg


def test_repeat_sets_differ() -> None:
    base = [rec("b", "1", r) for r in range(3)]
    cand = [rec("c", "1", r) for r in range(2)]
    with pytest.raises(PairingError, match=r"1 only in baseline \(1#2\)"):
        pair_records(base, cand)


def test_prompt_hash_mismatch_refused() -> None:
    base = [rec("b", str(i)) for i in range(5)]
    cand = [rec("c", str(i), prompt="other" if i in (1, 3) else None) for i in range(5)]
    with pytest.raises(PairingError, match=r"prompt hashes differ on 2 of 5 samples \(1, 3\)"):
        pair_records(base, cand)


def test_task_sets_version_target_and_duplicates_refused() -> None:
    with pytest.raises(PairingError, match="task sets differ: 1 only in baseline"):
        pair_records([rec("b", "1"), rec("b", "1", task="u")], [rec("c", "1")])
    with pytest.raises(PairingError, match="task versions differ"):
        pair_records([rec("b", "1")], [rec("c", "1", version="2")])
    with pytest.raises(PairingError, match="target hashes differ"):
        pair_records([rec("b", "1", target_hash="x")], [rec("c", "1", target_hash="y")])
    with pytest.raises(PairingError, match="duplicate sample"):
        pair_records([rec("b", "1"), rec("b", "1")], [rec("c", "1")])
    with pytest.raises(PairingError, match="baseline arm has no records"):
        pair_records([], [rec("c", "1")])


def test_errors_are_dropped_from_both_arms_and_counted() -> None:
    base = [rec("b", "1", 0, scores={"acc,none": 1.0}), rec("b", "1", 1, scores={"acc,none": None}, error="timeout"),
            rec("b", "2", 0, scores={"acc,none": 0.0}), rec("b", "3", 0, scores={"acc,none": 1.0}),
            rec("b", "2", 1, scores={"acc,none": 1.0}), rec("b", "3", 1, scores={"acc,none": 1.0})]
    cand = [rec("c", "1", 0, scores={"acc,none": 0.0}), rec("c", "1", 1, scores={"acc,none": 1.0}),
            rec("c", "2", 0, scores={"acc,none": 1.0}), rec("c", "3", 0, scores={"acc,none": None}, error="oom"),
            rec("c", "2", 1, scores={"acc,none": 1.0}), rec("c", "3", 1, scores={"acc,none": None}, error="oom")]
    pm = paired_metric(pair_records(base, cand)[0], "acc,none")
    assert (pm.n_errors_baseline, pm.n_errors_candidate, pm.n_dropped_items) == (1, 2, 1)
    assert pm.item_ids == ("1", "2")
    assert pm.repeats.tolist() == [1, 2]  # item 1 keeps repeat 0 only
    np.testing.assert_allclose(pm.base, [1.0, 0.5])
    np.testing.assert_allclose(pm.cand, [0.0, 1.0])
    assert pm.binary


def test_clusters_carried_and_mismatch_refused() -> None:
    base = [rec("b", str(i), cluster=f"doc{i // 2}") for i in range(4)] + [rec("b", "9")]
    cand = [rec("c", str(i), cluster=f"doc{i // 2}") for i in range(4)] + [rec("c", "9")]
    pm = paired_metric(pair_records(base, cand)[0], "acc,none")
    assert pm.clusters == ("doc0", "doc0", "doc1", "doc1", "item:9")
    cand[0] = rec("c", "0", cluster="elsewhere")
    with pytest.raises(PairingError, match="cluster keys differ"):
        pair_records(base, cand)


def test_every_metric_filter_becomes_a_paired_metric_with_agreement() -> None:
    sb = {"exact_match,strict-match": 0.0, "exact_match,flexible-extract": 1.0}
    base = [rec("b", "1", scores=sb, completion="The answer is 4", extracted={"strict-match": None, "flexible-extract": "4"}),
            rec("b", "2", scores=sb, completion="It is 5", extracted={"strict-match": None, "flexible-extract": "5"})]
    cand = [rec("c", "1", scores=sb, completion="The answer is 4", extracted={"strict-match": None, "flexible-extract": "4"}),
            rec("c", "2", scores=sb, completion="It is 6", extracted={"strict-match": None, "flexible-extract": "6"})]
    tasks = pair_records(base, cand)
    assert score_keys(tasks[0]) == ["exact_match,flexible-extract", "exact_match,strict-match"]
    flex, strict = paired_metrics(tasks)
    assert (flex.metric, flex.filter) == ("exact_match", "flexible-extract")
    assert flex.extracted_same.tolist() == [True, False]
    assert strict.extracted_same.tolist() == [True, True]  # both "no answer"
    assert flex.completion_same.tolist() == [True, False]


def test_non_binary_scores_flagged() -> None:
    pm = paired_metric(pair_records([rec("b", "1", scores={"f1,none": 0.5})], [rec("c", "1", scores={"f1,none": 1.0})])[0], "f1,none")
    assert not pm.binary and pm.extracted_same is None


def test_generation_fields_reduce_like_scores() -> None:
    def g(arm: str, item: str, repeat: int, truncated: bool | None, tokens: int | None) -> SampleRecord:
        return rec(arm, item, repeat, completion="x").model_copy(update={"truncated": truncated, "output_tokens": tokens})

    base = [g("b", "1", 0, True, 256), g("b", "1", 1, False, 40), g("b", "2", 0, False, 30), g("b", "2", 1, None, 99)]
    cand = [g("c", "1", 0, True, 256), g("c", "1", 1, True, 256), g("c", "2", 0, False, 50), g("c", "2", 1, False, 60)]
    (pt,) = pair_records(base, cand)
    trunc = paired_generation(pt, "truncated")
    assert (trunc.metric, trunc.filter, trunc.binary) == ("truncated", "none", True)
    assert (trunc.n_errors_baseline, trunc.n_errors_candidate) == (1, 0)  # item 2 repeat 1: not recorded
    assert trunc.repeats.tolist() == [2, 1]
    np.testing.assert_allclose(trunc.base, [0.5, 0.0])
    np.testing.assert_allclose(trunc.cand, [1.0, 0.0])
    assert trunc.extracted_same is None and trunc.completion_same is None  # no answer agreement for a field
    tokens = paired_generation(pt, "output_tokens")
    assert not tokens.binary and tokens.repeats.tolist() == [2, 2]
    np.testing.assert_allclose(tokens.base, [148.0, 64.5])
    np.testing.assert_allclose(tokens.cand, [256.0, 55.0])
