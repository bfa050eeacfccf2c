"""qa.compare.cache_path on hand-made sessions records: identical-output rates, first divergence, KL(cold ||
warm), flips, hit rates per turn depth, the shuffled A/A floor, the candidate-vs-baseline statistics
(checked against hand-computed values, scipy and statsmodels) and the cold-only per-task estimates."""

from __future__ import annotations

import math

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats as sps

from evals.records.samples import write_records
from qa.compare.arms import Arm, compare_arms, load_arm
from qa.compare.cache_path import cache_path_estimates, first_divergence, hit_rate, standard_records
from qa.errors import PairingError
from qa.files.comparison import StatsSettings
from tests.qa.cache_path_fixtures import KEY, Served, arm_records, record, same_everywhere

SETTINGS = StatsSettings(bootstrap_n=0)


def _kl(p: float, q: float) -> float:
    return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))


def _units(warm_changes: dict[tuple[int, int], Served], shuffled_changes: dict[tuple[int, int], Served] | None = None,
           cached: int = 60) -> dict[tuple[int, int], dict[str, Served]]:
    units = {}
    for s in range(3):
        for t in (1, 2):
            cold = Served(f"answer {s} {t}", float((s + t) % 2), 0.8)
            warm = warm_changes.get((s, t), Served(cold.completion, cold.score, cold.p))
            warm = Served(warm.completion, warm.score, warm.p, cached if t > 1 else 0)
            units[(s, t)] = {"cold": cold, "warm": warm, "shuffled": (shuffled_changes or {}).get((s, t), cold)}
    return units


BASE = arm_records("baseline", _units({(0, 2): Served("answer 0 X", 0.0, 0.7)}))
CAND = arm_records("candidate", _units({(1, 2): Served("wrong", 0.0, 0.6), (2, 1): Served("answer 2 1!", 0.0, 0.6)},
                                       {(2, 2): Served("answer 2 2", 0.0, 0.8000001)}))


@pytest.fixture(scope="module")
def est():  # type: ignore[no-untyped-def]
    (one,) = cache_path_estimates(BASE, CAND, SETTINGS)
    return one


def test_first_divergence_is_a_character_offset() -> None:
    assert first_divergence("answer 0 2", "answer 0 X") == 9
    assert first_divergence("answer 2 1", "answer 2 1!") == 10  # a strict prefix differs at its end
    assert first_divergence("same", "same") is None


def test_per_arm_identical_outputs_divergence_and_flips(est) -> None:  # type: ignore[no-untyped-def]
    b, c = est.baseline, est.candidate
    assert (b.arm, c.arm) == ("baseline", "candidate")
    assert (b.n, b.n_sessions, b.identical.agree, b.diverged, b.first_divergence) == (6, 3, 5, 1, 9.0)
    assert (c.identical.agree, c.diverged, c.first_divergence) == (4, 2, 5.0)  # median of offsets 0 and 10
    assert (b.flips[KEY].n10, b.flips[KEY].n01) == (0, 0)
    assert (c.flips[KEY].n10, c.flips[KEY].n01, c.flips[KEY].n) == (2, 0, 6)  # n10: cold scored higher
    assert 0 <= c.identical.ci95.lower < 4 / 6 < c.identical.ci95.upper <= 1


def test_hit_rates_per_arm_and_turn_depth(est) -> None:  # type: ignore[no-untyped-def]
    b = est.baseline
    assert (b.prompt_tokens, b.cached_tokens, b.hit_rate, b.cold_hit_rate) == (600, 180, 0.3, 0.0)
    t1, t2 = b.per_turn
    assert (t1.turn, t1.n, t1.hit_rate, t1.identical.agree) == (1, 3, 0.0, 3)
    assert (t2.turn, t2.n, t2.hit_rate, t2.identical.agree, t2.first_divergence) == (2, 3, 0.6, 2, 9.0)
    assert t1.kld == 0.0 and t2.kld == pytest.approx(_kl(0.8, 0.7) / 3, rel=1e-9)
    unknown = [r.model_copy(update={"meta": {**r.meta, "cached_tokens": None}}) for r in BASE]
    assert hit_rate(unknown) == (None, None, None)  # the engine did not say: not a 0


def test_kl_cold_warm_per_arm_is_token_weighted_and_clustered(est) -> None:  # type: ignore[no-untyped-def]
    assert est.baseline.kld.value == pytest.approx(_kl(0.8, 0.7) / 6, rel=1e-9)
    assert est.candidate.kld.value == pytest.approx(2 * _kl(0.8, 0.6) / 6, rel=1e-9)
    assert est.baseline.kld.n_chunks == 3  # sessions are the clusters
    assert est.candidate.top1_agree.value == 1.0


def test_kl_difference_matches_statsmodels_cluster_robust_ols(est) -> None:  # type: ignore[no-untyped-def]
    k1, k2 = _kl(0.8, 0.7), _kl(0.8, 0.6)
    # units in (session, turn) order: (0,1) (0,2) (1,1) (1,2) (2,1) (2,2)
    d = np.array([0.0, -k1, 0.0, k2, k2, 0.0])
    groups = np.array([0, 0, 1, 1, 2, 2])
    fit = sm.OLS(d, np.ones((6, 1))).fit(cov_type="cluster", cov_kwds={"groups": groups})
    kl = est.kld
    assert (kl.n, kl.n_clusters, kl.df) == (6, 3, 2)
    assert kl.delta == pytest.approx(float(fit.params[0]), rel=1e-12)
    # CR1 as statsmodels computes it, floored at the item-level SE (qa.stats.basic.gate_mean_se)
    assert kl.se == pytest.approx(max(float(fit.bse[0]), float(np.std(d, ddof=1) / np.sqrt(6))), rel=1e-9)
    h = sps.t.ppf(0.95, 2) * kl.se
    assert (kl.ci90.lower, kl.ci90.upper) == pytest.approx((kl.delta - h, kl.delta + h), rel=1e-9)
    assert (kl.mean_baseline, kl.mean_candidate) == pytest.approx((k1 / 6, 2 * k2 / 6), rel=1e-9)


def test_excess_flips_is_the_sign_test_with_the_baseline_as_floor(est) -> None:  # type: ignore[no-untyped-def]
    ex = est.excess_flips[KEY]
    assert (ex.n, ex.flips_candidate, ex.flips_rerun, ex.only_candidate, ex.only_rerun) == (6, 2, 0, 2, 0)
    assert ex.p_excess == pytest.approx(sps.binomtest(2, 2, 0.5, alternative="greater").pvalue)
    assert ex.aa_delta == 0.0  # the baseline's own warm - cold accuracy change


def test_accuracy_of_the_candidate_warm_path_against_the_baseline_cold_path(est) -> None:  # type: ignore[no-untyped-def]
    (acc,) = est.accuracy
    assert (acc.task, acc.metric, acc.filter, acc.n, acc.n_clusters) == ("sessions", "exact_match", "none", 6, 3)
    assert (acc.mean_baseline, acc.mean_candidate) == pytest.approx((0.5, 1 / 6))
    assert acc.delta == pytest.approx(-2 / 6)
    assert acc.ci_method == "cluster_cr1_t"


def test_shuffled_floor_counts_bit_identical_outputs_and_topk(est) -> None:  # type: ignore[no-untyped-def]
    fb, fc = est.baseline.floor, est.candidate.floor
    assert (fb.n, fb.identical_outputs.agree, fb.identical_topk.agree, fb.kld) == (6, 6, 6, 0.0)
    assert (fc.identical_outputs.agree, fc.identical_topk.agree) == (6, 5)  # one log-prob moved by 1e-7
    assert fc.kld > 0


def test_warm_equal_to_cold_gives_zero_divergence() -> None:
    (e,) = cache_path_estimates(same_everywhere("a"), same_everywhere("b"), SETTINGS)
    assert e.baseline.identical.share == 1.0 and e.baseline.kld.value == 0.0 and e.baseline.diverged == 0
    assert e.kld.delta == 0.0 and e.kld.se == 0.0
    assert e.excess_flips[KEY].p_excess == 1.0


def test_standard_estimates_use_the_cold_path_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert {r.meta["cache_path"] for r in standard_records(BASE)} == {"cold"}
    for arm, recs in (("baseline", BASE), ("candidate", CAND)):
        write_records(tmp_path / arm / "sessions.jsonl", recs)
    comp = compare_arms(load_arm(tmp_path / "baseline"), load_arm(tmp_path / "candidate"), SETTINGS)
    (e,) = comp.estimates
    assert (e.n, e.delta) == (6, 0.0)  # the cold paths are identical in both arms; the warm flips are not here
    assert comp.cache_path[0].candidate.flips[KEY].n10 == 2


def test_other_tasks_have_no_cache_path() -> None:
    plain = [r.model_copy(update={"meta": {}}) for r in BASE if r.meta["cache_path"] == "cold"]
    assert cache_path_estimates(plain, plain, SETTINGS) == []
    comp = compare_arms(Arm("b", "records", tuple(plain)), Arm("c", "records", tuple(plain)), SETTINGS)
    assert comp.cache_path == [] and comp.estimates[0].n == 6


def test_unpairable_records_are_one_line_errors() -> None:
    no_meta = [r.model_copy(update={"meta": {"cache_path": "cold"}}) for r in BASE]
    with pytest.raises(PairingError, match="no meta session/turn"):
        cache_path_estimates(no_meta, CAND, SETTINGS)
    missing = [r for r in CAND if r.item_id != "s002/t2/warm"]
    with pytest.raises(PairingError, match="warm paths differ on 1"):
        cache_path_estimates(BASE, missing, SETTINGS)
    other_prompt = [r.model_copy(update={"prompt_hash": "x"}) if r.item_id == "s000/t1/warm" else r for r in BASE]
    with pytest.raises(PairingError, match="different prompts"):
        cache_path_estimates(other_prompt, CAND, SETTINGS)
    with pytest.raises(PairingError, match="cache_path 'hot'"):
        cache_path_estimates([record("baseline", 0, 1, "hot", Served("x", 1.0, 0.8))], CAND, SETTINGS)
    with pytest.raises(PairingError, match="candidate arm has no warm/cold"):
        cache_path_estimates(BASE, [r.model_copy(update={"meta": {}}) for r in CAND], SETTINGS)


def test_several_shuffled_passes_pool_into_one_floor() -> None:
    second = [r.model_copy(update={"item_id": r.item_id.replace("/shuffled", "/shuffled2")})
              for r in CAND if r.meta["cache_path"] == "shuffled"]
    (e,) = cache_path_estimates(BASE, CAND + second, SETTINGS)
    floor = e.candidate.floor
    assert (floor.n, floor.identical_outputs.agree, floor.identical_topk.agree) == (12, 12, 10)
    with pytest.raises(PairingError, match="two shuffled2 records"):
        cache_path_estimates(BASE, CAND + second + second[:1], SETTINGS)
