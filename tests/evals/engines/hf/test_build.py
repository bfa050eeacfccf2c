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
    from evals.models import ResolvedModel

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = ResolvedModel(name="x", path=Path("/nonexistent"), hub_id=None, file_hash=None)  # never loaded: the device check comes first
    with pytest.raises(EngineError, match="CUDA is not available"):
        build(model, parse_args({"device": "cuda"}))
