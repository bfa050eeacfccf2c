"""qa.stats.multiplicity and the Wilson interval of qa.stats.basic against statsmodels (an oracle the
runtime does not import: it would cost about a second of every `qa gate`) and hand-computed values."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from qa.stats.basic import wilson_bounds
from qa.stats.multiplicity import benjamini_hochberg, holm


def test_holm_and_bh_match_statsmodels_on_random_and_tied_p_values(monkeypatch: pytest.MonkeyPatch) -> None:
    # statsmodels' holm ends in gc.collect(): up to seconds per call in a test process holding models (about
    # 400 s for these 300 calls in the whole suite). A collection changes no value it returns: skipped here.
    monkeypatch.setattr(gc, "collect", lambda generation=2: 0)
    rng = np.random.default_rng(7)
    for _ in range(300):
        p = list(rng.uniform(0, 1, int(rng.integers(1, 15))) ** 2)
        if len(p) > 2 and rng.random() < 0.3:
            p[1] = p[-1]  # ties
        assert np.allclose(holm(p), multipletests(p, method="holm")[1], rtol=0, atol=1e-15)
        assert np.allclose(benjamini_hochberg(p), multipletests(p, method="fdr_bh")[1], rtol=0, atol=1e-15)


def test_bh_by_hand() -> None:
    # m = 4: sorted 0.01, 0.02, 0.03, 0.5 -> 0.04, 0.04, 0.04, 0.5 (min over the larger ranks of m p / rank)
    assert benjamini_hochberg([0.5, 0.01, 0.03, 0.02]) == pytest.approx([0.5, 0.04, 0.04, 0.04])
    assert benjamini_hochberg([]) == []


@pytest.mark.parametrize(("k", "n"), [(0, 5), (5, 5), (3, 10), (2.5, 7.3), (1, 1), (40, 1172)])
def test_wilson_matches_statsmodels_also_for_effective_counts(k: float, n: float) -> None:
    for conf in (0.9, 0.95):
        lo, hi = proportion_confint(k, n, alpha=1 - conf, method="wilson")
        assert wilson_bounds(k, n, conf) == pytest.approx((max(0.0, lo), min(1.0, hi)), abs=1e-14)
