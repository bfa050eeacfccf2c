"""scripts/warm_drift.py, the parts that run without vLLM: configuration names parse and print back, a bad one
is refused in one line (exit 2), and the K/V comparisons count what differs (NVFP4's rewrite from quant.formats
on real tensors: one 16-block nudged across a rounding boundary is stored apart, identical blocks are not)."""

from __future__ import annotations

import pytest
import torch

from quant.formats import nvfp4
from scripts.warm_drift import Config, differ, main, rewrite_deterministic, same_bytes, tail

DECODE = torch.tensor(0.004)


def _nvfp4(x: torch.Tensor) -> torch.Tensor:
    q = nvfp4.quantize(x, decode_scale=DECODE)
    return nvfp4.dequantize(nvfp4.NVFP4Tensor(q.packed, q.scales, nvfp4.global_scale_from_decode_scale(DECODE)),
                            x.dtype)


@pytest.mark.parametrize("name", ["bf16/none", "fp32/nvfp4", "bf16/nvfp4/chunk128"])
def test_config_names_round_trip(name: str) -> None:
    config = Config.parse(name)
    assert config.name == name
    args = config.engine_args()
    assert args["enable_prefix_caching"] is True
    assert ("kv" in args) == (config.kv == "nvfp4")
    assert args.get("max_num_batched_tokens") == config.chunk


@pytest.mark.parametrize("name", ["fp16/none", "bf16/fp8", "bf16/none/chunk", "bf16"])
def test_a_bad_config_is_refused_in_one_line(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--configs", name]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("warm_drift: config") and "\n" not in err


def _at(x: torch.Tensor, j: int, value: float) -> torch.Tensor:
    y = x.clone()
    y[j] = value
    return y


def test_one_ulp_apart_can_be_stored_a_whole_nvfp4_step_apart() -> None:
    """The amplification in one element: two float32 inputs next to each other on either side of a rounding
    boundary are stored a whole NVFP4 level apart (the block's amax, so its scale, unchanged)."""
    block = torch.randn(16, generator=torch.Generator().manual_seed(0)) * 2
    j = int((block.abs() < block.abs().max() / 2).nonzero()[0])  # an element well below the block's amax
    lo, hi = float(block[j]), float(block[j]) + float(block.abs().max()) / 3  # a largest level spacing away
    assert not torch.equal(_nvfp4(_at(block, j, lo)), _nvfp4(_at(block, j, hi)))
    for _ in range(80):  # bisect to neighbouring float32 values that are stored apart
        mid = float(torch.tensor((lo + hi) / 2, dtype=torch.float32))
        if mid in (lo, hi):
            break
        same = torch.equal(_nvfp4(_at(block, j, mid)), _nvfp4(_at(block, j, lo)))
        lo, hi = (mid, hi) if same else (lo, mid)
    a, b = _nvfp4(_at(block, j, lo)), _nvfp4(_at(block, j, hi))
    assert hi - lo <= 2 * torch.finfo(torch.float32).eps * abs(hi)
    assert (a - b).abs().max() > 1e4 * (hi - lo)


def test_differ_and_rewrite_determinism_count_what_differs() -> None:
    torch.manual_seed(0)
    k, v = torch.randn(8, 3, 64), torch.randn(8, 3, 64)
    k2 = k.clone()
    k2[5, 1, 3] += 1e-3  # one element of one 16-block
    pre_a, pre_b = [(k, v)], [(k2, v)]
    post_a, post_b = [(_nvfp4(k), _nvfp4(v))], [(_nvfp4(k2), _nvfp4(v))]
    d = differ(pre_a, pre_b, 8)
    assert d["first_layer"] == 0 and d["share"] == pytest.approx(1 / (2 * k.numel()))
    assert d["max_abs"] == pytest.approx(1e-3, rel=1e-3)
    assert rewrite_deterministic(pre_a, post_a, pre_b, post_b, 8) == (2 * 8 * 3 * 4 - 1, 0)
    assert differ(tail(pre_a, 6), tail(pre_b, 6), 2)["first_layer"] is None  # rows 6, 7: untouched
    assert same_bytes(post_a[0][1], post_b[0][1]) and not same_bytes(k, k2)
