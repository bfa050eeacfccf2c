"""benchmarks/kv_fidelity_native.py's pure parts, no engine: the plugin spec it puts beside each native cache
(per device), that spec valid for the plugin, and the one-line refusals of bad arguments."""

from __future__ import annotations

import pytest

from benchmarks import kv_fidelity_native as native
from evals.engines.vllm.kv.spec import refusal
from quant.kv.spec import kv_spec_from_dict

ONE = {"scales": "constant", "constant_scale": 1.0}


def test_plugin_spec_follows_the_native_path_of_each_device():
    assert native.plugin_kv("fp8", ONE, "cpu") == {"format": "fp8_e4m3", **ONE, "fp8_rounding": "toward_zero"}
    assert native.plugin_kv("fp8_e5m2", ONE, "cuda") == {"format": "fp8_e5m2", **ONE}  # CUDA casts: nearest
    assert native.plugin_kv("nvfp4", ONE, "cuda") == {"format": "nvfp4", **ONE}  # FlashInfer FA2: model-dtype Q
    assert native.plugin_kv("nvfp4", ONE, "cuda-sm100") == {"format": "nvfp4", **ONE, "query_format": "fp8_e4m3",
                                                            "output_format": "fp8_e4m3"}
    for name in native.EMULATED:
        for device in ("cpu", "cuda", "cuda-sm100"):
            assert refusal(kv_spec_from_dict(native.plugin_kv(name, ONE, device))) is None


@pytest.mark.parametrize("argv, message", [
    (["--native", "int4"], "--native 'int4': choose from"),
    (["--native", ""], "--native '(none)'"),
    (["--chunks", "0"], "must be positive"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, message, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exc:
        native.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
