"""kv-inspect numbers against a reference quantizer applied to the same captured K/V."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from quant.errors import QuantError
from quant.formats.minifloat import e4m3_round
from quant.formats.registry import get_format
from quant.kv.inspect import INSPECT_SCHEMA_VERSION, InspectReport, inspect_kv, load_inspect, save_inspect
from quant.kv.spec import KVQuantSpec
from tests.tiny_models import TINY_LLAMA, plain_kv

torch.set_num_threads(1)
LAYERS = TINY_LLAMA["num_hidden_layers"]


@pytest.fixture(scope="module")
def prompts() -> torch.Tensor:
    return torch.randint(0, 128, (3, 24), generator=torch.Generator().manual_seed(2))


def _captured(model, prompts):
    return [plain_kv(model, row[None]) for row in prompts]  # [prompt][layer] -> (K, V) each [1, H, T, D]


def test_sqnr_and_error_match_a_reference_quantizer(llama, prompts):
    report = inspect_kv(llama, prompts, KVQuantSpec(format="nvfp4"))
    fmt = get_format("nvfp4")
    captured = _captured(llama, prompts)
    for i in range(LAYERS):
        for kind in (0, 1):
            signal = noise = 0.0
            for per_layer in captured:
                x = per_layer[i][kind].double()
                d = (per_layer[i][kind].abs().amax() / 2688.0).reshape(1, 1, 1, 1)  # dynamic, per sequence
                xhat = fmt.dequantize(fmt.quantize(per_layer[i][kind], d)).double()
                signal += float((x * x).sum())
                noise += float(((xhat - x) ** 2).sum())
            stats = report.layers[i].k if kind == 0 else report.layers[i].v
            assert stats.sqnr_db == pytest.approx(10 * math.log10(signal / noise), rel=1e-5)
            assert stats.rel_error == pytest.approx(math.sqrt(noise / signal), rel=1e-5)
        assert 0 < report.layers[i].attn_rel_error < 1


def test_format_none_is_exact(llama, prompts):
    report = inspect_kv(llama, prompts, KVQuantSpec(format="none"))
    for layer in report.layers:
        assert layer.k.sqnr_db == math.inf and layer.v.rel_error == 0.0 and layer.attn_rel_error == 0.0
    assert InspectReport.model_validate_json(report.model_dump_json()) == report  # inf survives JSON


def test_underflow_and_saturation_shares_match_the_block_scales(llama, prompts):
    captured = _captured(llama, prompts)
    # a constant decode scale far too large: small blocks' E4M3 scale (amax / 6) / d rounds to 0 (underflow)
    under = inspect_kv(llama, prompts, KVQuantSpec(format="nvfp4", scales="constant", constant_scale=30.0))
    # a scale 100x too small: every block whose amax exceeds 2688 * d saturates
    over = inspect_kv(llama, prompts, KVQuantSpec(format="nvfp4", scale_multiplier=0.01))
    for i in range(LAYERS):
        blocks = torch.cat([p[i][1].reshape(-1, 16) for p in captured])  # V blocks of 16 along head_dim
        amax = blocks.abs().amax(-1)
        gs = torch.tensor(
            1 / 30.0, dtype=torch.float32
        )  # encode scale fl32(1/d), kernel order gs * (amax * 1/6)
        expect_under = float(((amax > 0) & (e4m3_round(gs * (amax * (1 / 6.0))) == 0)).float().mean())
        assert under.layers[i].v.underflow_share == pytest.approx(expect_under, abs=1e-7)
        d = torch.cat(
            [(p[i][1].abs().amax() / 2688.0 * 0.01).expand(p[i][1].numel() // 16) for p in captured]
        )
        expect_sat = float((amax / d > 2688.0).float().mean())
        assert over.layers[i].v.saturation_share == pytest.approx(expect_sat, abs=1e-7)
        assert expect_sat > 0
    assert any(layer.v.underflow_share > 0 for layer in under.layers)


def test_report_saved_and_loaded_as_kv_inspect_json_and_plotted(llama, prompts, tmp_path):
    spec = KVQuantSpec(format="fp8_e4m3", skip_layers=(1,))
    report = inspect_kv(llama, prompts[:1], spec, model_name="tiny")
    path = save_inspect(tmp_path / "run" / "kv_inspect.json", report)
    again = load_inspect(path)
    assert again == report and again.n_prompts == 1 and again.tokens_per_prompt == 24
    assert again.schema_version == INSPECT_SCHEMA_VERSION and isinstance(again.spec, KVQuantSpec)
    assert again.spec == spec.model_copy(update={"prefill_reads_quantized": True})
    assert math.isinf(again.layers[1].k.sqnr_db)  # the skipped layer is exact: Infinity in the file
    assert '"sqnr_db": Infinity' in path.read_text()


def test_the_report_schema_reads_without_torch(llama, prompts, tmp_path):
    """The report and the gate read kv_inspect.json through quant.kv.inspect_report: no torch loaded."""
    from quant.kv import inspect_report

    assert InspectReport is inspect_report.InspectReport and load_inspect is inspect_report.load_inspect  # one class
    spec = KVQuantSpec(format="q8_0", profile="llamacpp", skip_layers=(1,))
    path = save_inspect(tmp_path / "kv_inspect.json", inspect_kv(llama, prompts[:1], spec, model_name="tiny"))
    code = ("import sys\nfrom quant.kv.inspect_report import load_inspect\n"
            f"r = load_inspect({str(path)!r})\n"
            "print(r.spec.profile, r.layers[1].k.sqnr_db, sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["llamacpp", "inf", "[]"]


def test_bad_kv_inspect_files_give_one_line_errors_naming_the_path(llama, prompts, tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(QuantError, match=f"^{missing}: no kv-inspect report there"):
        load_inspect(missing)
    bad = tmp_path / "kv_inspect.json"
    bad.write_text("{not json")
    with pytest.raises(QuantError, match=f"^{bad}: not a kv-inspect report") as err:
        load_inspect(bad)
    assert "\n" not in str(err.value)
    # the flat shape the report used to guess at is refused, not half-read
    bad.write_text(json.dumps({"k_sqnr_db": [20.0, 21.0], "v_sqnr_db": [19.0, 18.0]}))
    with pytest.raises(QuantError, match="not a kv-inspect report"):
        load_inspect(bad)
    good = json.loads(inspect_kv(llama, prompts[:1], KVQuantSpec(format="nvfp4")).model_dump_json())
    bad.write_text(json.dumps({**good, "schema_version": 2}))
    with pytest.raises(QuantError, match="schema_version"):
        load_inspect(bad)
    bad.write_text(json.dumps({**good, "spec": {**good["spec"], "format": "nvfp5"}}))
    with pytest.raises(QuantError, match="spec.format.*did you mean 'nvfp4'"):
        load_inspect(bad)
