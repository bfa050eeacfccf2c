"""evals.servers.spec: a vLLM server's `kv` is a typed KVQuantSpec, and a server spec's JSON form (what
resolved.json keeps) round-trips through server_spec_to_json / server_spec_from_json, its `kv` written as
quant.kv.spec.kv_spec_to_json writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.servers.spec import LlamaCppServerSpec, VllmServerSpec, server_spec_from_json, server_spec_to_json
from quant.errors import QuantError
from quant.kv.spec import KVQuantSpec, kv_spec_from_dict

KV = kv_spec_from_dict({"format": "nvfp4", "scales": "constant", "constant_scale": 0.004, "skip_layers": [0]})


def test_a_vllm_server_spec_round_trips_through_its_json_form(tmp_path: Path) -> None:
    spec = VllmServerSpec(model=tmp_path, args={"max_model_len": 2048, "x": {"a": [1]}}, python="py",
                          env={"A": "1"}, kv=KV)
    data = server_spec_to_json(spec)
    assert data["model"] == str(tmp_path) and data["kv"] == KV.model_dump(mode="json")  # every field written out
    back = server_spec_from_json("vllm", json.loads(json.dumps(data)))  # through a file's text
    assert back == spec and isinstance(back, VllmServerSpec) and isinstance(back.kv, KVQuantSpec)
    assert server_spec_to_json(VllmServerSpec(model=tmp_path))["kv"] is None
    assert server_spec_from_json("vllm", server_spec_to_json(VllmServerSpec(model=tmp_path))).kv is None


def test_a_json_form_written_before_still_loads(tmp_path: Path) -> None:
    """The form resolved.json has always kept: the fields, paths as strings, `kv` as the spec's full dump."""
    written = {"model": str(tmp_path), "served_model_name": "model", "args": {}, "python": "python", "env": {},
               "kv": {"format": "qa_int4", "layer_formats": {"3": "none"}, "skip_layers": [0], "scales": "dynamic",
                      "scales_file": None, "constant_scale": None, "recent_window": 0, "recent_format": "fp8_e4m3",
                      "prefill_reads_quantized": True, "scale_multiplier": 1.0, "v_scale_layout": "linear",
                      "corrupt_block_fraction": 0.0, "corrupt_seed": 0}}
    back = server_spec_from_json("vllm", written)
    assert isinstance(back, VllmServerSpec) and back.kv is not None
    assert back.kv.format == "qa_int4" and back.kv.layer_formats == {3: "none"} and back.kv.skip_layers == (0,)
    assert server_spec_to_json(back) == written


def test_a_kv_that_is_not_a_spec_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(QuantError, match=r"^kv cache spec: format: .*nvfp5") as err:
        server_spec_from_json("vllm", {"model": str(tmp_path), "kv": {"format": "nvfp5"}})
    assert "\n" not in str(err.value)


def test_a_llamacpp_server_spec_round_trips(tmp_path: Path) -> None:
    spec = LlamaCppServerSpec(gguf=tmp_path / "m.gguf", cache_type_k="q8_0", n_ctx=4096, env={"B": "2"})
    data = server_spec_to_json(spec)
    assert "kv" not in data and data["gguf"] == str(tmp_path / "m.gguf")
    assert server_spec_from_json("llamacpp", data) == spec
