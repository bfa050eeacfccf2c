"""quant.validation: the first pydantic error as the parts of a one-line message."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from quant.validation import did_you_mean, first_error


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int

    @field_validator("size")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("size must be positive")
        return v


class _Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inner: _Inner
    name: str


def _error(data: dict) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        _Outer.model_validate(data)
    return info.value


def test_nested_location_and_value_error_prefix_dropped() -> None:
    err = first_error(_error({"inner": {"size": -1}, "name": "x"}))
    assert err.where == "inner.size"
    assert err.msg == "size must be positive"
    assert err.input == -1 and err.more == 0


def test_unknown_key_type_and_count_of_further_problems() -> None:
    err = first_error(_error({"inner": {"size": 1, "szie": 2}}))  # unknown key + missing name
    assert err.type in {"extra_forbidden", "missing"}
    assert err.more == 1


def test_top_level_problem_uses_the_default_location() -> None:
    with pytest.raises(ValidationError) as info:
        _Inner.model_validate("not a mapping")
    err = first_error(info.value)
    assert err.where == "" and err.where_or("spec") == "spec"


def test_did_you_mean_suggests_the_closest_key_or_lists_them() -> None:
    assert did_you_mean("recent_windo", ["format", "recent_window"]) == "did you mean 'recent_window'?"
    assert did_you_mean("zzz", ["format", "scales"]) == "known keys: format, scales"
