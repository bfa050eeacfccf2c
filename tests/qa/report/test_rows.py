"""qa.report.rows: the task row's cells, the KV summary rows of a kv_inspect report (hand-computed)."""

from __future__ import annotations

import math

import pytest

from qa.files.comparison import McNemar
from qa.files.policy import default_policy
from qa.gate.rules import apply_rules
from qa.report.rows import db, kv_rows, layer_ranges, table_row
from quant.kv.inspect import InspectReport, KindStats, LayerReport
from quant.kv.spec import KVQuantSpec
from tests.qa.gate_fixtures import comparison, estimate_from_scores, scores


def _kind(sqnr: float, under: float = 0.0, sat: float = 0.0) -> KindStats:
    return KindStats(sqnr_db=sqnr, rel_error=10 ** (-sqnr / 20), underflow_share=under, saturation_share=sat, amax=1.0)


def test_kv_rows_group_layers_by_format_hand_computed() -> None:
    layers = [
        LayerReport(layer=0, format="nvfp4", k=_kind(20.0, 0.01), v=_kind(18.0, sat=0.5), attn_rel_error=0.1),
        LayerReport(layer=1, format="nvfp4", k=_kind(22.0, 0.03), v=_kind(17.0), attn_rel_error=0.3),
        LayerReport(layer=2, format="none", k=_kind(math.inf), v=_kind(math.inf), attn_rel_error=0.0),
        LayerReport(layer=3, format="nvfp4", k=_kind(18.0), v=_kind(19.0), attn_rel_error=0.2),
    ]
    report = InspectReport(model="m", spec=KVQuantSpec(skip_layers=(2,)), scales="dynamic", n_prompts=1,
                           tokens_per_prompt=8, layers=layers)
    assert kv_rows(report) == [
        # K: mean(20, 22, 18) = 20.0, min 18.0; V: mean(18, 17, 19) = 18.0, min 17.0
        # underflow K: mean(0.01, 0.03, 0) = 1.3%; saturation V: mean(0.5, 0, 0) = 16.7%
        ["nvfp4", "0-1, 3", "20.0 / 18.0", "18.0 / 17.0", "1.3% / 0", "0 / 16.7%", "0.2 / 0.3"],
        ["none", "2", "exact / exact", "exact / exact", "0 / 0", "0 / 0", "0 / 0"],
    ]


@pytest.mark.parametrize(
    ("layers", "text"), [([0, 1, 2, 5, 7, 8], "0-2, 5, 7-8"), ([3], "3"), ([], ""), ([9, 10, 12], "9-10, 12")]
)
def test_layer_ranges(layers: list[int], text: str) -> None:
    assert layer_ranges(layers) == text


def test_db_names_the_infinite_cases() -> None:
    assert (db(20.04), db(math.inf), db(-math.inf)) == ("20.0", "exact", "-inf")


def test_mcnemar_cell_says_when_it_is_the_sign_test_on_items() -> None:
    a, b = scores(200, 120, 12, 4)
    est = estimate_from_scores("arc", a, b)
    tv = apply_rules(comparison(est), default_policy()).tasks[0]
    assert table_row(tv, est)[9].sub.startswith("mid-p")
    on_items = est.model_copy(update={"mcnemar": McNemar(n10=12, n01=4, p_exact=0.077, p_midp=0.05,
                                                         method="sign_test_items")})
    cell = table_row(tv, on_items)[9]
    assert cell.main == "0.077" and cell.sub == "sign test on items; mid-p 0.050"


def test_a_task_without_an_estimate_is_dashes() -> None:
    a, b = scores(200, 120, 12, 4)
    tv = apply_rules(comparison(estimate_from_scores("arc", a, b)), default_policy()).tasks[0]
    row = table_row(tv, None)
    assert row[0].main == "arc" and all(c.main == "-" for c in row[2:])
