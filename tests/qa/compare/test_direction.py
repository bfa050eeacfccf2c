"""Which way is better per metric (qa.compare.direction), McNemar's discordant counts following it, and the
gate refusing to read a lower-is-better metric with its higher-is-better margins
(qa.gate.rules.select_estimate): one line, PolicyError."""

from __future__ import annotations

import pytest

from qa.compare.direction import higher_is_better
from qa.errors import PolicyError
from qa.files.policy import TaskPolicy
from qa.gate.rules import select_estimate
from tests.qa.compare.test_estimate import _keyed
from tests.qa.gate_fixtures import comparison

BASE = [2.0, 2.1, 1.9, 2.2, 2.0, 1.8, 2.3, 2.05]
WORSE = [x + 0.3 for x in BASE]  # an NLL 0.3 nats higher on every item


def test_direction_by_metric_name() -> None:
    for lower in ("nll", "nll,none", "truncated,none", "perplexity", "bits_per_byte,none", "kld"):
        assert not higher_is_better(lower)
    for higher in ("acc,none", "exact_match,strict-match", "top1_acc,none", "loglikelihood,none"):
        assert higher_is_better(higher)


def test_the_gate_refuses_a_lower_is_better_metric_instead_of_passing_a_worse_candidate() -> None:
    nll = _keyed(BASE, WORSE, "nll,none").model_copy(update={"task": "wikitext_kl"})
    top1 = _keyed([1.0] * 8, [1.0] * 8, "top1_acc,none").model_copy(update={"task": "wikitext_kl"})
    both = comparison(nll, top1)
    with pytest.raises(PolicyError, match=r"task wikitext_kl: nll,none is lower-is-better and the gate's margins "
                                          r"read higher as better; gate one of top1_acc,none") as err:
        select_estimate(both, "wikitext_kl", TaskPolicy(metric="nll,none"), explicit=True)
    assert "\n" not in str(err.value)
    assert select_estimate(both, "wikitext_kl", TaskPolicy(metric="top1_acc,none"), explicit=True) is top1
    with pytest.raises(PolicyError, match="gate another task's metric"):
        select_estimate(comparison(nll), "wikitext_kl", TaskPolicy(), explicit=False)


def test_mcnemars_discordant_counts_follow_the_metrics_direction() -> None:
    base = [1.0] * 6 + [0.0] * 2 + [1.0] * 4 + [0.0] * 8
    cand = [0.0] * 6 + [1.0] * 2 + [1.0] * 4 + [0.0] * 8  # 1 -> 0 on 6 items, 0 -> 1 on 2, 12 concordant
    acc, trunc = _keyed(base, cand, "acc,none"), _keyed(base, cand, "truncated,none")
    assert acc.mcnemar is not None and trunc.mcnemar is not None and acc.flips is not None and trunc.flips is not None
    # accuracy: 6 items lost a correct answer (n10, regressions), 2 gained one (n01, improvements)
    assert (acc.mcnemar.n10, acc.mcnemar.n01) == (acc.items_worse, acc.items_better) == (6, 2)
    assert (acc.flips.n10, acc.flips.n01) == (6, 2)
    # truncated (lower is better): the candidate stopped running out of budget on 6 items (improvements)
    # and started on 2 (regressions)
    assert (trunc.mcnemar.n10, trunc.mcnemar.n01) == (trunc.items_worse, trunc.items_better) == (2, 6)
    assert (trunc.flips.n10, trunc.flips.n01) == (2, 6)
    assert trunc.delta == acc.delta == pytest.approx(-4 / 20)  # delta is candidate - baseline either way
    # two-sided, so the same p in both directions; by hand, X ~ Bin(8, 1/2): exact 2 P(X <= 2) = 2 * 37/256,
    # mid-p = exact - P(X = 2) = (74 - 28) / 256
    assert acc.mcnemar.p_exact == trunc.mcnemar.p_exact == pytest.approx(74 / 256)
    assert acc.mcnemar.p_midp == trunc.mcnemar.p_midp == pytest.approx(46 / 256)
