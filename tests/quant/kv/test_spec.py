"""KVQuantSpec validation: one-line QuantErrors with did-you-mean hints."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file  # a scales folder written without torch

from quant.errors import QuantError
from quant.kv.spec import kv_spec_from_dict, kv_spec_from_json, kv_spec_to_json


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
    from quant.formats import catalog as kv_catalog
    from quant.formats import ggml_blocks
    from quant.formats import registry as formats
    from quant.kv import profiles as kv_profiles

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
        "from quant.kv.spec import kv_spec_from_dict\n"
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


def test_scales_may_name_a_model_folder_checked_once_without_torch(tmp_path):
    """`scales = "DIR"`: the folder's K/V scales, checked where the spec is read (torch-free: safetensors
    headers), dumped as static + scales_file so a dumped spec never reads the folder again."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "quantization_config": {
        "quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8, "type": "float"}}}))
    save_file({f"model.layers.{i}.self_attn.{kind}_scale": np.array([0.01], dtype=np.float32)
               for i in range(2) for kind in "kv"}, str(folder / "model.safetensors"))
    code = (
        "import sys\n"
        "from quant.kv.spec import kv_spec_from_dict\n"
        f"spec = kv_spec_from_dict({{'format': 'fp8_e4m3', 'scales': {str(folder)!r}}})\n"
        "print(spec.scales, spec.scales_file.name, spec.model_dump()['scales'])\n"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["static ckpt static", "[]"]
    again = kv_spec_from_dict(kv_spec_from_dict({"scales": str(folder)}).model_dump())
    assert (again.scales, again.scales_file) == ("static", folder)
    with pytest.raises(QuantError, match=r"^kv cache spec: scales 'statc': not a model folder; did you mean 'static'"):
        kv_spec_from_dict({"scales": "statc"})
    with pytest.raises(QuantError, match="no K/V scales") as err:
        kv_spec_from_dict({"scales": str(tmp_path)})  # a folder without scales
    assert "\n" not in str(err.value)
    with pytest.raises(QuantError, match="drop scales_file"):
        kv_spec_from_dict({"scales": str(folder), "scales_file": "x"})
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    with pytest.raises(QuantError, match="unknown convention"):
        kv_spec_from_dict({"scales": str(folder)})


@pytest.mark.parametrize("given", [
    {"format": "nvfp4", "scales": "constant", "constant_scale": 1},
    {"format": "qa_int4", "layer_formats": {3: "none", 5: "qa_int8"}, "skip_layers": [0, "sliding_window"]},
    {"format": "fp8_e4m3", "scales": "static", "scales_file": "/models/m", "profile": None},
    {"format": "nvfp4", "recent_window": 8, "prefill_reads_quantized": False, "query_format": "fp8_e4m3"},
])
def test_the_json_pair_round_trips_through_text(given: dict) -> None:
    spec = kv_spec_from_dict(given)
    data = kv_spec_to_json(spec)
    assert data == spec.model_dump(mode="json")  # every field written out: the form resolved.json has kept
    back = kv_spec_from_json(json.loads(json.dumps(data)))
    assert back == spec and kv_spec_to_json(back) == data
    assert type(back.constant_scale) is type(spec.constant_scale)  # a 1 stays 1 (arm.json fingerprints it)


def test_json_that_is_not_an_object_is_one_quant_error() -> None:
    with pytest.raises(QuantError, match="^kv cache spec: a JSON object of the kv table's keys, got list$"):
        kv_spec_from_json(["nvfp4"])
    with pytest.raises(QuantError, match="unknown key 'fromat'"):
        kv_spec_from_json({"fromat": "nvfp4"})
