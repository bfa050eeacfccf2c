"""evals.servers.spec: a vLLM server's `kv` table parsed once, in one place (VllmServerSpec.kv_spec), and the
specs' fields as the resolved record stores them."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from evals.errors import EngineError
from evals.servers.spec import VllmServerSpec
from quant.kv.spec import kv_spec_from_dict

KV = {"format": "nvfp4", "scales": "constant", "constant_scale": 0.004}


def test_the_kv_table_is_parsed_once_per_spec(tmp_path: Path) -> None:
    spec = VllmServerSpec(model=tmp_path, kv=KV)
    parsed = spec.kv_spec
    assert parsed == kv_spec_from_dict(dict(KV)) and parsed is not None and parsed.format == "nvfp4"
    assert spec.kv_spec is parsed  # cached: the same object every time
    assert VllmServerSpec(model=tmp_path).kv_spec is None  # no table: the plugin is off


def test_a_kv_table_that_is_not_a_spec_is_one_engine_error(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"^vllm server: .*nvfp5") as err:
        _ = VllmServerSpec(model=tmp_path, kv={"format": "nvfp5"}).kv_spec
    assert "\n" not in str(err.value)


def test_the_parsed_table_is_not_a_field(tmp_path: Path) -> None:
    """What resolved.json stores (asdict) and reads back (a TypeAdapter) is the spec's fields only."""
    spec = VllmServerSpec(model=tmp_path, kv=KV)
    assert spec.kv_spec is not None
    fields = asdict(spec)
    assert "kv_spec" not in fields and fields["kv"] == KV
    back = TypeAdapter(VllmServerSpec).validate_python(fields)
    assert back == spec and back.kv_spec == spec.kv_spec
