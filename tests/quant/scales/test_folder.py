"""A model folder's K/V scales read as vLLM finds them and resolved for the format being emulated: our export
round-trips to the bit into the emulated cache; hand-built unit cases (tests.quant.ckpt_folders) for each
convention load as the decode scales they stand for and are converted for another format; all-1.0 scales and
numbers that fit another convention than declared are refused unless taken as they are; folders without
scales or in an unknown convention are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qa.pipeline.calibration import calibrate_model
from quant.errors import QuantError
from quant.formats.registry import get_format
from quant.kv.cache import make_cache
from quant.kv.calibrate import CalibrationSpec
from quant.kv.spec import kv_spec_from_dict
from quant.scales.export import SCALES_FILE, export_model_folder
from quant.scales.files import KVScales, amax_for_decode
from quant.scales.folder import (
    CONVENTION_FILE,
    ObservedAmax,
    has_kv_scales,
    read_folder_scales,
    resolve_folder_scales,
    scales_files,
)
from tests.evals.hf_fixtures import save_tiny
from tests.quant.ckpt_folders import k_scale_folder, tensor_group_encode_folder
from tests.tiny_models import CORPUS

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def calibrated(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, KVScales]:
    text = tmp_path_factory.mktemp("text") / "calib.txt"
    text.write_text(CORPUS * 10, encoding="utf-8")
    return {fmt: calibrate_model(str(tiny), str(text), CalibrationSpec(format=fmt, n_samples=2, seq_len=32))
            for fmt in ("nvfp4", "fp8_e4m3")}


def _config(folder: Path):  # -> LlamaConfig
    from transformers import AutoConfig  # transformers: the cache is built for the model's config

    return AutoConfig.from_pretrained(folder)


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8_e4m3"])
def test_calibrate_export_load_same_scales_to_the_bit(fmt: str, tiny: Path, calibrated: dict[str, KVScales],
                                                      tmp_path: Path) -> None:
    scales = calibrated[fmt]
    out = tmp_path / "out"
    export_model_folder(scales, tiny, out)
    folder = read_folder_scales(out)
    assert folder.convention.name == {"nvfp4": "nvfp4-decode", "fp8_e4m3": "fp8-decode"}[fmt]
    assert folder.declared_by == CONVENTION_FILE and folder.vllm_loads
    assert folder.fields == ("model.layers.{i}.self_attn.k_scale", "model.layers.{i}.self_attn.v_scale")
    loaded = KVScales.load(out)
    assert loaded.meta == scales.meta  # the calibration record travels with the folder
    assert torch.equal(loaded.k_scale, scales.k_scale) and torch.equal(loaded.v_scale, scales.v_scale)
    # the emulated cache of `kv = { format = fmt, scales = "DIR" }` stores with exactly those decode scales
    spec = kv_spec_from_dict({"format": fmt, "scales": str(out)})
    cache = make_cache(_config(tiny), spec)
    for i, layer in enumerate(cache.layers):
        assert layer.k.scale.view(torch.int32).item() == scales.k_scale[i].view(torch.int32).item()
        assert layer.v.scale.view(torch.int32).item() == scales.v_scale[i].view(torch.int32).item()


def test_a_tensor_group_encode_folder_loads_as_the_decode_scales_it_stands_for(tmp_path: Path) -> None:
    k_amax, v_amax = [3.25, 17.0], [0.71, 2.5]
    folder = tensor_group_encode_folder(tmp_path / "lc", k_amax, v_amax)
    fs = read_folder_scales(folder)
    assert fs.fields == ("model.layers.{i}.self_attn.k_global_scale", "model.layers.{i}.self_attn.v_global_scale")
    assert fs.convention.name == "nvfp4-encode" and not fs.vllm_loads
    assert "refuses a kv_cache_scheme of num_bits=4" in fs.vllm_note
    gs = torch.tensor([k[0] for k in fs.k], dtype=torch.float32)
    assert torch.equal(gs, 2688.0 / torch.tensor(k_amax))  # compressed-tensors' 448 * 6 / amax, float32
    loaded = KVScales.load(folder)
    assert loaded.meta.observer == "external" and loaded.meta.format == "nvfp4"
    d = (1.0 / gs.double()).float()  # the decode scale 1 / gs stands for
    ulp = torch.nextafter(d, torch.full_like(d, 1.0)) - d
    assert bool(((loaded.k_scale - d).abs() <= ulp).all())  # exactly d where a float32 amax gives d
    cache = make_cache(_config(folder), kv_spec_from_dict({"format": "nvfp4", "scales": str(folder)}))
    assert [float(layer.k.scale) for layer in cache.layers] == loaded.k_scale.tolist()
    assert loaded.k_scale.tolist() == pytest.approx([a / 2688 for a in k_amax], rel=1e-6)


def test_amax_for_decode_gives_each_decode_scale_exactly_where_one_exists() -> None:
    gen = torch.Generator().manual_seed(0)
    amax = torch.rand(4096, generator=gen) * 50 + 1e-3
    for fmt in ("nvfp4", "fp8_e4m3"):
        decode = get_format(fmt).decode_scale_from_amax
        d = decode(amax)
        assert torch.equal(decode(amax_for_decode(d, decode)), d)
    # an arbitrary float32 (1 / gs) has no exact preimage about 1 time in 6: the nearest is 1 ulp away
    bits = torch.randint(0x38000000, 0x3F000000, (4096,), generator=gen, dtype=torch.int64).to(torch.int32)
    d = bits.view(torch.float32)
    decode = get_format("nvfp4").decode_scale_from_amax
    got = decode(amax_for_decode(d, decode))
    steps = (got.view(torch.int32).long() - bits.long()).abs()
    assert int(steps.max()) <= 1 and 0 < int((steps == 1).sum()) < 4096 // 3


def test_folders_without_scales_or_in_an_unknown_convention_are_refused(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(QuantError, match="no K/V scales"):
        read_folder_scales(tiny)
    assert not has_kv_scales(tiny) and not has_kv_scales(tmp_path / "absent")
    bare = save_tiny(tmp_path / "bare")  # k_scale tensors, no quantization config: vLLM would not load them
    save_file({f"model.layers.{i}.self_attn.{kind}_scale": torch.tensor(0.01) for i in range(2) for kind in "kv"},
              str(bare / "kv.safetensors"))
    assert has_kv_scales(bare)
    with pytest.raises(QuantError, match="unknown convention: no kv_scales_convention.json") as err:
        read_folder_scales(bare)
    assert "\n" not in str(err.value)
    (bare / CONVENTION_FILE).write_text(json.dumps({"convention": "nvfp4_decode"}))
    with pytest.raises(QuantError, match="did you mean 'nvfp4-decode'"):
        read_folder_scales(bare)
    gap = k_scale_folder(tmp_path / "gap", [0.01, 0.02], [0.01, 0.02], num_bits=8)
    save_file({"model.layers.3.self_attn.k_scale": torch.tensor(0.5)}, str(gap / "extra.safetensors"))
    with pytest.raises(QuantError, match=r"layers \[2\] have no scale"):
        read_folder_scales(gap)
    bad = k_scale_folder(tmp_path / "bad", [0.01, -0.02], [0.01, 0.02], num_bits=8)
    with pytest.raises(QuantError, match="not positive and finite"):
        read_folder_scales(bad)


def test_llmcompressor_fp8_folder_and_the_files_behind_a_scales_argument(calibrated: dict[str, KVScales],
                                                                         tiny: Path, tmp_path: Path) -> None:
    fp8 = k_scale_folder(tmp_path / "fp8", [0.02, 0.03], [0.01, 0.04], num_bits=8)
    fs = read_folder_scales(fp8)
    assert (fs.convention.name, fs.vllm_loads) == ("fp8-decode", True)
    assert "kv_cache_scheme num_bits=8" in fs.declared_by
    assert [p.name for p in scales_files(fp8)] == ["config.json", "model.safetensors"]
    export_model_folder(calibrated["nvfp4"], tiny, tmp_path / "ours")
    assert [p.name for p in scales_files(tmp_path / "ours")] == ["config.json", CONVENTION_FILE, SCALES_FILE]
    stem = tmp_path / "s"
    calibrated["nvfp4"].save(stem)
    assert [p.name for p in scales_files(stem)] == ["s.safetensors", "s.json"]
    assert scales_files(tmp_path / "absent") == []


def test_a_folder_is_converted_for_the_format_that_reads_it(tmp_path: Path) -> None:
    k_amax, v_amax = [3.0, 12.0], [0.6, 2.4]
    glob = k_scale_folder(tmp_path / "glob", [a / 6 for a in k_amax], [a / 6 for a in v_amax], num_bits=4)
    rs = resolve_folder_scales(glob, "nvfp4")
    assert (rs.declared.name, rs.read_as.name, rs.fit, rs.problems) == ("nvfp4-global", "nvfp4-decode", None, ())
    assert "num_bits=4 float tensor (calculate_qparams" in rs.scales.declared_by and not rs.scales.vllm_loads
    assert [k[0] for k in rs.k_decode] == pytest.approx([a / 2688 for a in k_amax], rel=1e-6)
    loaded = KVScales.load(glob)  # the folder's own format (nvfp4), as the hf engine reads it
    assert loaded.k_scale.tolist() == pytest.approx([a / 2688 for a in k_amax], rel=1e-6)
    assert "nvfp4-global: amax / 6" in loaded.meta.convention and "read as nvfp4-decode" in loaded.meta.convention
    fp8 = k_scale_folder(tmp_path / "fp8", [a / 448 for a in k_amax], [a / 448 for a in v_amax], num_bits=8)
    as_fp8 = resolve_folder_scales(fp8, "fp8_e4m3")
    assert as_fp8.k_decode == read_folder_scales(fp8).k  # already in the format's convention: the stored numbers
    as_nvfp4 = KVScales.load(fp8, kv_format="nvfp4")
    assert as_nvfp4.k_scale.tolist() == pytest.approx([a / 2688 for a in k_amax], rel=1e-6)
    assert resolve_folder_scales(fp8, "qa_int8").k_decode is None  # no tensor-scale convention: amax only
    assert [k[0] for k in resolve_folder_scales(fp8, "qa_int8").k_amax] == pytest.approx(k_amax, rel=1e-6)


def test_ones_and_misdeclared_numbers_are_refused_unless_taken_as_they_are(tmp_path: Path) -> None:
    ones = k_scale_folder(tmp_path / "ones", [1.0, 1.0], [1.0, 1.0], num_bits=8)
    with pytest.raises(QuantError, match="K/V scales refused: every K/V scale is 1.0") as err:
        resolve_folder_scales(ones, "nvfp4")
    assert "scales_as_is = true" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(QuantError, match="every K/V scale is 1.0"):
        kv_spec_from_dict({"format": "nvfp4", "scales": str(ones)})
    spec = kv_spec_from_dict({"format": "nvfp4", "scales": str(ones), "scales_as_is": True})
    assert spec.scales_as_is and spec.model_dump()["scales_as_is"] is True
    assert "scales_as_is" not in kv_spec_from_dict({"format": "nvfp4"}).model_dump()  # old dumps unchanged
    with pytest.raises(QuantError, match="scales_as_is is read only with scales = a model folder"):
        kv_spec_from_dict({"format": "nvfp4", "scales_as_is": True})
    # NVFP4 decode scales (amax/2688) under an 8-bit scheme that declares amax/448: the fit finds them 6x off
    k_amax, v_amax = [3.0, 12.0], [0.6, 2.4]
    wrong = k_scale_folder(tmp_path / "wrong", [a / 2688 for a in k_amax], [a / 2688 for a in v_amax], num_bits=8)
    seen = ObservedAmax(k=[a * 1.3 for a in k_amax], v=v_amax, on="tiny on text: 2 x 32 tokens")
    with pytest.raises(QuantError, match=r"declared fp8-decode \(amax / 448\) but the numbers fit nvfp4-decode "
                                         r"\(amax / 2688\): off by 6x \(fit on tiny on text: 2 x 32 tokens\)"):
        resolve_folder_scales(wrong, "nvfp4", observed=seen)
    rs = resolve_folder_scales(wrong, "nvfp4", observed=seen, take_as_is=True)
    assert rs.taken_as_is and rs.fit is not None and rs.fit.convention == "nvfp4-decode"
    record = rs.reading()
    assert (record.declared, record.fitted, record.read_as, record.fit_on) == (
        "fp8-decode", "nvfp4-decode", "nvfp4-decode", "tiny on text: 2 x 32 tokens")
    assert record.problems == [rs.problems[0]] and "off by 6x" in record.problems[0]
    # taken as declared: amax = stored * 448, so the NVFP4 decode scales are 6x the ones meant
    assert [k[0] for k in rs.k_decode] == pytest.approx([a / 2688 * 448 / 2688 for a in k_amax], rel=1e-6)
    with pytest.raises(QuantError, match="scales for 2 layers, the model observed has 3"):
        resolve_folder_scales(wrong, "nvfp4", observed=ObservedAmax(k=[1.0] * 3, v=[1.0] * 3, on="x"))
