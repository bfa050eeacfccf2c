"""Calibration observers and the scales file, checked against independent computations on captured K/V."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from quant.errors import QuantError
from quant.formats.registry import get_format
from quant.kv.cache import make_cache
from quant.kv.calibrate import MSE_GRID, CalibrationSpec, calibrate, token_chunks
from quant.kv.spec import KVQuantSpec
from quant.scales.files import KVScales, scales_paths
from tests.tiny_models import TINY_LLAMA, plain_kv

torch.set_num_threads(1)
LAYERS, HEADS = TINY_LLAMA["num_hidden_layers"], TINY_LLAMA["num_key_value_heads"]


@pytest.fixture(scope="module")
def chunks() -> torch.Tensor:
    stream = torch.randint(0, 128, (2000,), generator=torch.Generator().manual_seed(7)).tolist()
    return token_chunks(stream, n_samples=5, seq_len=32, seed=0)


def _captured(model, chunks: torch.Tensor) -> dict[tuple[int, str], torch.Tensor]:
    """K and V of every layer over all chunks, [n, H, T, D] each, from a plain DynamicCache (`plain_kv`)."""
    out: dict[tuple[int, str], list[torch.Tensor]] = {}
    for row in chunks:
        for i, (k, v) in enumerate(plain_kv(model, row[None])):
            out.setdefault((i, "k"), []).append(k)
            out.setdefault((i, "v"), []).append(v)
    return {key: torch.cat(v) for key, v in out.items()}


def _calibrate(model, chunks, **kw) -> KVScales:
    return calibrate(model, chunks, CalibrationSpec(**kw), data_name="random", model_name="tiny-llama")


def test_token_chunks_are_seeded_non_overlapping_windows():
    stream = list(range(100))
    a = token_chunks(stream, 3, 10, seed=1)
    assert torch.equal(a, token_chunks(stream, 3, 10, seed=1))
    assert not torch.equal(a, token_chunks(stream, 3, 10, seed=2))
    assert a.shape == (3, 10) and bool((a[:, 0] % 10 == 0).all())  # window starts on multiples of seq_len
    assert token_chunks(stream, 50, 30, seed=0).shape == (3, 30)  # only 3 full windows exist
    with pytest.raises(QuantError, match="fewer than one sample"):
        token_chunks(stream[:5], 1, 10, seed=0)


def test_absmax_scales_saved_loaded_and_equal_to_independent_amax(llama, chunks, tmp_path):
    scales = _calibrate(llama, chunks, observer="absmax")
    tensors_path, meta_path = scales.save(tmp_path / "scales")
    assert (tensors_path.name, meta_path.name) == ("scales.safetensors", "scales.json")
    loaded = KVScales.load(tmp_path / "scales.safetensors")
    kv = _captured(llama, chunks)
    for i in range(LAYERS):
        for kind, amax_t, scale_t in (
            ("k", loaded.k_amax, loaded.k_scale),
            ("v", loaded.v_amax, loaded.v_scale),
        ):
            amax = float(kv[(i, kind)].abs().max())
            assert float(amax_t[i]) == amax
            assert float(scale_t[i]) == pytest.approx(amax / (448 * 6), rel=1e-7)
    meta = json.loads(meta_path.read_text())
    assert meta["observer"] == "absmax" and meta["data"]["n_samples"] == 5 and meta["data"]["seq_len"] == 32
    assert meta["convention"].startswith("decode: d = amax / 2688")
    assert loaded.k_scale.dtype == torch.float32 and loaded.k_scale.shape == (LAYERS,)


def test_head_granularity_and_fp8_convention(llama, chunks):
    scales = _calibrate(llama, chunks, observer="absmax", granularity="head", format="fp8_e4m3")
    kv = _captured(llama, chunks)
    assert scales.k_amax.shape == (LAYERS, HEADS)
    for i in range(LAYERS):
        per_head = kv[(i, "v")].abs().amax(dim=(0, 2, 3))
        assert torch.equal(scales.v_amax[i], per_head)
        torch.testing.assert_close(scales.v_scale[i], per_head / 448.0, rtol=1e-7, atol=0)
    assert scales.amax(1, "v").shape == (1, HEADS, 1, 1)


@pytest.mark.parametrize("granularity", ["tensor", "head"])
def test_percentile_matches_numpy_inverted_cdf(llama, chunks, granularity):
    scales = _calibrate(llama, chunks, observer="percentile", percentile=99.0, granularity=granularity)
    kv = _captured(llama, chunks)
    for i in range(LAYERS):
        x = kv[(i, "k")].abs()  # [n, H, T, D]
        if granularity == "tensor":
            expect = np.percentile(x.numpy().ravel(), 99.0, method="inverted_cdf")
            assert float(scales.k_amax[i]) == pytest.approx(float(expect), rel=0, abs=0)
        else:
            for h in range(HEADS):
                expect = np.percentile(x[:, h].numpy().ravel(), 99.0, method="inverted_cdf")
                assert float(scales.k_amax[i, h]) == float(expect)
    assert bool(
        (scales.k_amax <= _calibrate(llama, chunks, observer="absmax", granularity=granularity).k_amax).all()
    )


# 5 x 32 tokens: every 4th when capped at 50
@pytest.mark.parametrize(("max_tokens", "stride"), [(8192, 1), (50, 4)])
def test_mse_picks_the_clip_factor_with_the_least_error(llama, chunks, max_tokens, stride):
    scales = _calibrate(llama, chunks, observer="mse", mse_max_tokens=max_tokens)
    assert scales.meta.mse_token_stride == stride
    kv = _captured(llama, chunks)
    fmt = get_format("nvfp4")
    for i in range(LAYERS):
        amax = kv[(i, "v")].abs().max()  # over every token
        x = kv[(i, "v")][:, :, ::stride]
        errors = [
            float((fmt.dequantize(fmt.quantize(x, fmt.decode_scale_from_amax(c * amax))) - x).square().sum())
            for c in MSE_GRID
        ]
        best = int(np.argmin(errors))
        assert scales.meta.mse_clip_v[i] == MSE_GRID[best]
        torch.testing.assert_close(scales.v_amax[i], MSE_GRID[best] * amax)


def test_calibration_is_deterministic(llama, chunks):
    a = _calibrate(llama, chunks, observer="percentile", percentile=99.9)
    b = _calibrate(llama, chunks, observer="percentile", percentile=99.9)
    assert torch.equal(a.k_amax, b.k_amax) and torch.equal(a.v_scale, b.v_scale)
    assert a.meta == b.meta


def test_static_cache_uses_the_calibrated_scales(llama, chunks, tmp_path):
    scales = _calibrate(llama, chunks, observer="absmax")
    scales.save(tmp_path / "s")
    cache = make_cache(
        llama.config, KVQuantSpec(format="nvfp4", scales="static", scales_file=tmp_path / "s.json")
    )
    with torch.no_grad():
        llama(input_ids=chunks[:1, :8], cache=cache, use_cache=True)
    for i, layer in enumerate(cache.layers):
        assert float(layer.k.scale) == float(scales.k_amax[i] / 2688.0)
        assert float(layer.v.scale) == float(scales.v_scale[i])


def test_bad_scales_files_are_rejected(llama, chunks, tmp_path):
    from safetensors.torch import save_file

    scales = _calibrate(llama, chunks, observer="absmax")
    tensors_path, _ = scales.save(tmp_path / "s")
    for bad in (float("nan"), float("inf"), -1.0, 0.0):
        t = {
            "k_amax": scales.k_amax,
            "v_amax": scales.v_amax,
            "k_scale": scales.k_scale.clone(),
            "v_scale": scales.v_scale,
        }
        t["k_scale"][0] = bad
        save_file(t, str(tensors_path))
        with pytest.raises(QuantError, match="k_scale"):
            KVScales.load(tmp_path / "s")
    tensors_path.write_bytes(b"\x80\x04 not safetensors (a pickle header)")
    with pytest.raises(QuantError, match="not a safetensors file"):
        KVScales.load(tmp_path / "s")
    with pytest.raises(QuantError, match="not found"):
        KVScales.load(tmp_path / "missing")
    assert scales_paths(tmp_path / "x.json")[0].name == "x.safetensors"


def test_formats_without_a_tensor_scale_cannot_be_calibrated(llama, chunks):
    with pytest.raises(QuantError, match="no per-tensor scale"):
        _calibrate(llama, chunks, format="qa_mxfp4")


def test_static_head_scales_quantize_each_head_with_its_own_scale(llama, chunks):
    scales = _calibrate(llama, chunks, observer="absmax", granularity="head")
    cache = make_cache(llama.config, KVQuantSpec(format="nvfp4", scales="static"), scales)
    ids = chunks[:1, :8]
    with torch.no_grad():
        llama(input_ids=ids, cache=cache, use_cache=True)
    v0 = plain_kv(llama, ids)[0][1]
    fmt = get_format("nvfp4")
    d = (scales.v_amax[0] / 2688.0).reshape(1, HEADS, 1, 1)
    assert torch.equal(cache.layers[0].v.scale, d)
    stored = cache.layers[0].v.stored()[0]
    assert torch.equal(stored.data["packed"], fmt.quantize(v0, d).data["packed"])
    assert (
        cache.layers[0].v.nbytes() == stored.data["packed"].numel() * 9 // 8 + 4 * HEADS
    )  # one fp32 per head


def test_smollm2_scales_file_matches_independent_amax_per_layer(tmp_path):
    from evals.errors import ModelError
    from evals.models.load import load_model
    from evals.models.resolve import resolve_model

    try:
        model, _ = load_model(resolve_model("smollm2-135m"))
    except ModelError as exc:
        pytest.skip(f"SmolLM2 not available: {exc}")
    ids = token_chunks(
        torch.randint(100, 40000, (400,), generator=torch.Generator().manual_seed(0)).tolist(), 2, 64, 0
    )
    calibrate(
        model, ids, CalibrationSpec(n_samples=2, seq_len=64), data_name="random", model_name="smollm2"
    ).save(tmp_path / "smol")
    loaded = KVScales.load(tmp_path / "smol")
    kv = _captured(model, ids)
    assert loaded.num_layers == 30 and loaded.meta.num_kv_heads == 3
    for i in range(30):
        for kind, scale in (("k", loaded.k_scale), ("v", loaded.v_scale)):
            expect = float(kv[(i, kind)].abs().max()) / (448 * 6)  # float64 reference
            assert float(scale[i]) == pytest.approx(expect, rel=1e-7)
