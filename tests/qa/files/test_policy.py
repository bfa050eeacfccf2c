"""Gate policy parsing: the shipped default, overrides, and one-line errors for every mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from qa.errors import PolicyError
from qa.files.policy import (
    TaskPolicy,
    default_policy,
    default_policy_text,
    load_policy,
    parse_policy,
    resolve_policy,
)


def test_default_policy_is_noninferiority_and_matches_model_defaults() -> None:
    p = default_policy()
    assert p.name == "default"
    assert p.default.rules == ("noninferiority",)
    assert (p.default.margin, p.default.alpha, p.default.sigma_k, p.default.sigma_basis) == (
        0.02,
        0.05,
        1.5,
        "baseline",
    )
    # The shipped file writes out every default: an empty [default] means the same policy.
    assert p.default == TaskPolicy()
    assert "sigma_k = 1.5" in default_policy_text()


def test_task_override_merges_over_default() -> None:
    p = parse_policy(
        """
        require = ["gsm8k"]
        [default]
        margin = 0.05
        [tasks.gsm8k]
        rules = ["tost", "sigma"]
        metric = "exact_match,strict-match"
        """
    )
    g = p.for_task("gsm8k")
    assert g.rules == ("tost", "sigma")
    assert g.margin == 0.05  # inherited from [default]
    assert g.metric == "exact_match,strict-match"
    assert p.for_task("arc") == p.default
    assert p.require == ("gsm8k",)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("x = 1", "unknown key 'x'"),
        ("[default]\nmarign = 0.1", "did you mean 'margin'"),
        ("[tasks.gsm8k]\nalhpa = 0.1", "[tasks.gsm8k]: unknown key 'alhpa'; did you mean 'alpha'?"),
        ("[default]\nmargin = -1", "[default] margin: Input should be greater than 0"),
        ("[default]\nmargin = 0", "greater than 0"),
        ("[default]\nalpha = 0.5", "alpha"),
        ("[default]\nrules = []", "at least one rule"),
        ('[default]\nrules = ["sigma", "sigma"]', "listed twice"),
        ('[default]\nrules = ["bayes"]', "'noninferiority', 'tost' or 'sigma'"),
        ('[tasks.g]\nmetric = "acc"', "'metric,filter'"),
        ('[tasks.g]\nmargin = "0.02"', "valid number"),  # strict: a string is not silently converted
        ('[default]\nunderpowered = "pass"', "underpowered"),
        ("[default]\nmin_n = 0", "min_n"),
        ('require = "gsm8k"', "should be a list"),
        ("tasks = 3", "'tasks' must be a table"),
        ("[tasks]\ngsm8k = 1", "tasks.gsm8k must be a table"),
        ("[default\n", "not valid TOML"),
        ("version = 2", "version"),
    ],
)
def test_bad_policies_raise_one_line(text: str, needle: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "gate.toml")
    msg = str(info.value)
    assert needle in msg
    assert msg.startswith("gate.toml")
    assert "\n" not in msg


def test_load_policy_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="no such policy file"):
        load_policy(tmp_path / "nope.toml")


def test_load_and_resolve_policy_file(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text('name = "strict"\n[default]\nmargin = 0.01\n')
    assert load_policy(tmp_path / "p.toml").default.margin == 0.01
    assert resolve_policy("p.toml", relative_to=tmp_path).name == "strict"
    assert resolve_policy("default") == default_policy()
    assert resolve_policy(None) == default_policy()


def test_sha256_changes_with_content() -> None:
    a = parse_policy("[default]\nmargin = 0.02")
    b = parse_policy("[default]\nmargin = 0.03")
    assert a.sha256() != b.sha256()
    assert a.sha256() == parse_policy("[default]\nmargin = 0.02").sha256()


def test_default_policy_gates_truncation_and_names_the_model_card_filters() -> None:
    p = default_policy()
    assert (p.default.gate_truncation, p.default.truncation_margin) == (True, 0.02)
    assert "truncation_margin = 0.02" in default_policy_text()
    assert p.for_task("gsm8k_cot_llama").metric == "exact_match,strict-match"
    assert p.for_task("gsm8k_cot_zeroshot").metric == "exact_match,flexible-extract"
    assert p.for_task("gsm8k_cot_llama").truncation_margin == 0.02  # task entries inherit [default]
    for subset in ("diamond", "main", "extended"):
        assert p.for_task(f"gpqa_{subset}_cot_modelcard").metric == "exact_match,strict-match"
