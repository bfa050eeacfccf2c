"""Scale export for vLLM (per-layer k_scale / v_scale tensors) and compressed-tensors (kv_cache_scheme)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from quant.errors import QuantError
from quant.fileio import sha256_file
from quant.scales.export import (
    INDEX_FILE,
    SCALES_FILE,
    SCHEME_FILE,
    export_model_folder,
    export_scales,
    kv_cache_scheme,
)
from quant.scales.files import CalibrationData, KVScales, ScalesMeta
from quant.scales.folder import CONVENTION_FILE


def _scales(fmt: str = "nvfp4", granularity: str = "tensor") -> KVScales:
    div = {"nvfp4": 2688.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0, "qa_int8": 1.0}[fmt]
    k = torch.tensor([[1.0, 3.0], [2.0, 0.5], [8.0, 4.0]])  # [L=3, H=2]
    v = torch.tensor([[0.25, 0.5], [6.0, 1.0], [2.0, 2.0]])
    if granularity == "tensor":
        k, v = k.amax(-1), v.amax(-1)
    meta = ScalesMeta(
        format=fmt,
        convention="decode",
        observer="absmax",
        granularity=granularity,
        num_layers=3,
        num_kv_heads=2,
        model="m",
        data=CalibrationData(name="d", sha256="0", n_samples=1, seq_len=8),
        seed=0,
    )
    return KVScales(k_amax=k, v_amax=v, k_scale=k / div, v_scale=v / div, meta=meta)


def test_vllm_export_names_dtypes_and_values(tmp_path):
    paths = export_scales(_scales(), "vllm", tmp_path)
    assert [p.name for p in paths] == [SCALES_FILE]
    with safe_open(str(paths[0]), "pt") as f:
        names = sorted(f.keys())
        assert names == sorted(f"model.layers.{i}.self_attn.{kind}_scale" for i in range(3) for kind in "kv")
        expect_k, expect_v = [3.0, 2.0, 8.0], [0.5, 6.0, 2.0]
        for i in range(3):
            k = f.get_tensor(f"model.layers.{i}.self_attn.k_scale")
            v = f.get_tensor(f"model.layers.{i}.self_attn.v_scale")
            assert k.dtype == v.dtype == torch.float32 and k.shape == v.shape == ()
            assert float(k) == pytest.approx(expect_k[i] / (448 * 6), rel=1e-7)
            assert float(v) == pytest.approx(expect_v[i] / (448 * 6), rel=1e-7)
        assert f.metadata()["format"] == "nvfp4"


def test_vllm_export_of_head_scales_takes_the_max_over_heads(tmp_path):
    (path,) = export_scales(_scales("fp8_e4m3", "head"), "vllm", tmp_path)
    with safe_open(str(path), "pt") as f:
        assert float(f.get_tensor("model.layers.0.self_attn.k_scale")) == pytest.approx(3.0 / 448, rel=1e-7)
        assert float(f.get_tensor("model.layers.1.self_attn.v_scale")) == pytest.approx(6.0 / 448, rel=1e-7)


def test_compressed_tensors_scheme_blocks(tmp_path):
    paths = export_scales(_scales("nvfp4"), "compressed-tensors", tmp_path)
    assert [p.name for p in paths] == [SCALES_FILE, SCHEME_FILE]
    block = json.loads(paths[1].read_text())["kv_cache_scheme"]
    assert block == {
        "num_bits": 4,
        "type": "float",
        "strategy": "tensor_group",
        "group_size": 16,
        "dynamic": "local",
        "symmetric": True,
        "scale_dtype": "torch.float8_e4m3fn",
    }
    assert kv_cache_scheme(_scales("fp8_e4m3")) == {
        "num_bits": 8,
        "type": "float",
        "strategy": "tensor",
        "dynamic": False,
        "symmetric": True,
    }
    assert kv_cache_scheme(_scales("fp8_e4m3", "head"))["strategy"] == "attn_head"


def test_compressed_tensors_accepts_the_blocks():
    ct = pytest.importorskip("compressed_tensors.quantization")
    for scales in (_scales("nvfp4"), _scales("fp8_e4m3"), _scales("fp8_e4m3", "head")):
        args = ct.QuantizationArgs(**kv_cache_scheme(scales))
        assert args.num_bits == kv_cache_scheme(scales)["num_bits"]


def test_unexportable_combinations_raise(tmp_path):
    with pytest.raises(QuantError, match="granularity tensor"):
        export_scales(_scales("nvfp4", "head"), "compressed-tensors", tmp_path)
    with pytest.raises(QuantError, match="E4M3 only"):
        kv_cache_scheme(_scales("fp8_e5m2"))
    with pytest.raises(QuantError, match="unknown export target"):
        export_scales(_scales(), "tensorrt", tmp_path)  # type: ignore[arg-type]
    assert not (tmp_path / SCALES_FILE).exists()  # nothing written when the export cannot be completed


def _model_folder(root, layers: int = 3, index: bool = False):
    """A stand-in model folder: config.json, one weights file, a tokenizer file, a provenance stamp."""
    from safetensors.torch import save_file

    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": layers}))
    save_file({"model.embed_tokens.weight": torch.ones(4, 2)}, str(root / "model.safetensors"))
    (root / "tokenizer.json").write_text("{}")
    (root / "SOURCE_SHA256").write_text("abc  x.gguf\n")
    if index:
        (root / INDEX_FILE).write_text(json.dumps({"weight_map": {"model.embed_tokens.weight": "model.safetensors"}}))
    return root


def test_model_folder_has_config_scheme_weights_and_scales(tmp_path):
    src = _model_folder(tmp_path / "m", index=True)
    scales = _scales("fp8_e4m3", "head")
    written = export_model_folder(scales, src, tmp_path / "out")
    out = tmp_path / "out"
    assert sorted(p.name for p in written) == sorted(
        ["config.json", "model.safetensors", "tokenizer.json", INDEX_FILE, SCALES_FILE, CONVENTION_FILE])
    assert not (out / "SOURCE_SHA256").exists()  # the export is another model than the stamped source
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 3 and config["model_type"] == "llama"
    qc = config["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["config_groups"] == {}  # no weight is quantized
    assert qc["kv_cache_scheme"] == {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                     "symmetric": True}
    assert (out / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    weight_map = json.loads((out / INDEX_FILE).read_text())["weight_map"]
    assert weight_map["model.layers.2.self_attn.v_scale"] == SCALES_FILE
    assert weight_map["model.embed_tokens.weight"] == "model.safetensors"
    with safe_open(str(out / SCALES_FILE), "pt") as f:  # head scales: one per layer, the max over heads
        assert float(f.get_tensor("model.layers.0.self_attn.k_scale")) == pytest.approx(3.0 / 448, rel=1e-7)
        assert float(f.get_tensor("model.layers.1.self_attn.v_scale")) == pytest.approx(6.0 / 448, rel=1e-7)
    record = json.loads((out / CONVENTION_FILE).read_text())
    assert (record["convention"], record["formula"], record["vllm"]["kv_cache_dtype"]) == (
        "fp8-decode", "amax / 448", "fp8")
    assert record["scales_sha256"] == sha256_file(out / SCALES_FILE)
    assert "compressed_tensors_kv_cache_scheme" not in record  # FP8's scheme is config.json's own


def test_nvfp4_model_folder_carries_decode_scales_through_the_8_bit_scheme(tmp_path):
    """vLLM 0.32 loads k/v scales only through an 8-bit kv_cache_scheme; the numbers are NVFP4's decode
    multiplier amax / 2688, and the folder says so and how to run it."""
    src = _model_folder(tmp_path / "m")
    out = tmp_path / "out"
    export_model_folder(_scales("nvfp4"), src, out)
    assert (out / "tokenizer.json").samefile(src / "tokenizer.json")  # hard-linked, same file system
    assert (out / "model.safetensors").samefile(src / "model.safetensors")
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["kv_cache_scheme"] == {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                     "symmetric": True}
    with safe_open(str(out / SCALES_FILE), "pt") as f:
        for i, (k, v) in enumerate(zip([3.0, 2.0, 8.0], [0.5, 6.0, 2.0], strict=True)):
            assert float(f.get_tensor(f"model.layers.{i}.self_attn.k_scale")) == pytest.approx(k / 2688, rel=1e-7)
            assert float(f.get_tensor(f"model.layers.{i}.self_attn.v_scale")) == pytest.approx(v / 2688, rel=1e-7)
    record = json.loads((out / CONVENTION_FILE).read_text())
    assert (record["convention"], record["formula"], record["format"]) == ("nvfp4-decode", "amax / 2688", "nvfp4")
    assert record["vllm"]["kv_cache_dtype"] == "nvfp4" and "6x too small" in record["vllm"]["note"]
    assert record["fields"] == {"k": "model.layers.{i}.self_attn.k_scale", "v": "model.layers.{i}.self_attn.v_scale"}
    assert record["compressed_tensors_kv_cache_scheme"]["strategy"] == "tensor_group"  # llm-compressor's NVFP4 KV
    assert record["calibration"] == _scales("nvfp4").meta.model_dump()
    ct = pytest.importorskip("compressed_tensors.quantization")
    args = ct.QuantizationArgs(**record["compressed_tensors_kv_cache_scheme"])
    assert (args.num_bits, args.type, args.group_size) == (4, "float", 16)


def test_model_folder_refusals(tmp_path):
    src = _model_folder(tmp_path / "m")
    with pytest.raises(QuantError, match="takes fp8_e4m3, nvfp4, nvfp4_4over6 KV scales, not 'qa_int8'"):
        export_model_folder(_scales("qa_int8"), src, tmp_path / "a")
    (src / "tokenizer.json").rename(src / "vocab.txt")
    with pytest.raises(QuantError, match="no tokenizer"):
        export_model_folder(_scales("nvfp4"), src, tmp_path / "a")
    (src / "vocab.txt").rename(src / "tokenizer.json")
    with pytest.raises(QuantError, match="new folder"):
        export_model_folder(_scales("fp8_e4m3"), src, src)
    with pytest.raises(QuantError, match="3 layers, the model has 5"):
        export_model_folder(_scales("fp8_e4m3"), _model_folder(tmp_path / "five", layers=5), tmp_path / "b")
    export_model_folder(_scales("fp8_e4m3"), src, tmp_path / "c")
    with pytest.raises(QuantError, match="not an empty folder"):
        export_model_folder(_scales("fp8_e4m3"), src, tmp_path / "c")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
    with pytest.raises(QuantError, match="already has a quantization_config"):
        export_model_folder(_scales("fp8_e4m3"), src, tmp_path / "d")
    assert not (tmp_path / "a").exists() and not (tmp_path / "d").exists()
