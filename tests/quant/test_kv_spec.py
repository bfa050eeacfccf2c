"""KVQuantSpec validation: one-line QuantErrors with did-you-mean hints."""

from __future__ import annotations

import subprocess
import sys

import pytest

from quant.errors import QuantError
from quant.kv_spec import kv_spec_from_dict


def test_spec_validation_errors_are_one_line_quant_errors():
    with pytest.raises(QuantError, match="did you mean 'nvfp4'"):
        kv_spec_from_dict({"format": "nvfp"})
    with pytest.raises(QuantError, match="recent_window"):
        kv_spec_from_dict({"recent_window": -1})
    with pytest.raises(QuantError, match="unknown key 'formt'; did you mean 'format'"):
        kv_spec_from_dict({"formt": "nvfp4"})
    with pytest.raises(QuantError, match="constant_scale"):
        kv_spec_from_dict({"scales": "constant"})
    with pytest.raises(QuantError, match="block-scaled"):
        kv_spec_from_dict({"format": "fp8_e4m3", "v_scale_layout": "reversed"})


def test_the_catalog_names_exactly_the_registries():
    from quant import formats, ggml_blocks, kv_catalog, kv_profiles

    assert kv_catalog.FORMAT_NAMES == tuple(formats.FORMATS)
    assert kv_catalog.PROFILE_ONLY_FORMATS == tuple(ggml_blocks.GGML_FORMATS)
    assert kv_profiles.get_profile is kv_catalog.get_profile and kv_profiles.PROFILES is kv_catalog.PROFILES
    # the one unknown-format message, whether a spec or a lookup refuses the name
    with pytest.raises(QuantError) as by_lookup:
        formats.get_format("NVFP")
    with pytest.raises(QuantError) as by_spec:
        kv_spec_from_dict({"format": "NVFP"})
    assert str(by_lookup.value) in str(by_spec.value)


def test_a_spec_validates_without_torch():
    """A report or gate reads specs (kv_inspect.json, arm.json): validating one, profile included, loads no torch."""
    code = (
        "import sys\n"
        "from quant.errors import QuantError\n"
        "from quant.kv_spec import kv_spec_from_dict\n"
        "kv_spec_from_dict({'format': 'q8_0', 'profile': 'llamacpp', 'layer_formats': {0: 'nvfp4'},"
        " 'scales': 'constant', 'constant_scale': 1.0})\n"
        "try:\n"
        "    kv_spec_from_dict({'format': 'nvfp5'})\n"
        "except QuantError as exc:\n"
        "    print(exc)\n"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["kv cache spec: format: unknown KV format 'nvfp5'; did you mean 'nvfp4'?", "[]"]
