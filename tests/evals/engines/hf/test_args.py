"""HFEngineArgs: parsed once, unknown keys and bad values are one-line EngineErrors with did-you-mean,
the kv table becomes a KVQuantSpec, scales need a static kv spec, and the module loads no transformers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evals.engines.hf.args import HFEngineArgs, parse_args
from evals.errors import EngineError
from quant.kv.spec import KVQuantSpec


def _error(args: dict) -> str:
    with pytest.raises(EngineError) as err:
        parse_args(args)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_unknown_key_and_bad_values_are_one_line_errors() -> None:
    assert _error({"batchsize": 4}) == "hf engine: unknown argument 'batchsize'; did you mean 'batch_size'?"
    assert "batch_size" in _error({"batch_size": 0})
    assert "dtype" in _error({"dtype": "float64"})
    assert "draft_tokens" in _error({"draft_tokens": 17})


def test_kv_table_is_parsed_into_a_kv_quant_spec() -> None:
    args = parse_args({"kv": {"format": "nvfp4", "recent_window": 4}})
    assert isinstance(args.kv, KVQuantSpec)
    assert (args.kv.format, args.kv.recent_window) == ("nvfp4", 4)
    assert args.model_dump(exclude_unset=True, mode="json") == {"kv": {"format": "nvfp4", "recent_window": 4}}
    assert parse_args({}).kv is None
    spec = KVQuantSpec(format="fp8_e4m3")
    assert parse_args({"kv": spec}).kv == spec


def test_kv_errors_are_worded_as_the_kv_spec_words_them() -> None:
    assert _error({"kv": {"formatt": "nvfp4"}}) == (
        "hf engine: kv cache spec: unknown key 'formatt'; did you mean 'format'?")
    assert _error({"kv": {"format": "nvfp5"}}).startswith("hf engine: kv cache spec: format: unknown KV format 'nvfp5'")
    assert _error({"kv": {"scales": "constant"}}).startswith("hf engine: kv cache spec: scales = 'constant' needs")
    assert "'kv'" in _error({"kv": "nvfp4"})


def test_scales_file_needs_a_static_kv_spec() -> None:
    assert "without a 'kv' spec" in _error({"scales": "x.safetensors"})
    assert "set kv.scales = 'static'" in _error({"scales": "x.safetensors", "kv": {"format": "nvfp4"}})
    args = parse_args({"scales": "x.safetensors", "kv": {"scales": "static"}})
    assert args.scales == Path("x.safetensors")


def test_args_are_frozen() -> None:
    args = parse_args({"batch_size": 2})
    with pytest.raises(ValueError, match="frozen"):
        args.batch_size = 3  # type: ignore[misc]
    assert args.model_copy(update={"batch_size": 3}).batch_size == 3
    assert HFEngineArgs().batch_size == 16


def test_importing_the_args_loads_no_transformers() -> None:
    code = "import sys, evals.engines.hf.args, evals.engines.hf; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
