"""The plugin's per-call path (evals.engines.vllm.kv.emulate: rewrite_pair, rewrite, count_tokens) is capture-safe
for every format: traced whole by dynamo (fullgraph), run on fake tensors (a host read or a branch on values
raises) and on meta tensors (no tensor built on the CPU per call); on CUDA, captured in a CUDA graph and
replayed with new K/V, bit for bit the CPU reference, with the device counters right. No vllm needed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from evals.engines.vllm.kv.emulate import LayerPlan, count_tokens, layer_plan, rewrite, rewrite_pair
from quant.formats import compiled
from quant.formats.registry import get_format, quantize_dequantize
from quant.kv.spec import KVQuantSpec
from quant.scales.files import CalibrationData, KVScales, ScalesMeta

H, D = 2, 64
SPECS = {
    "nvfp4": {"format": "nvfp4", "scales": "static"},  # per-head static scales (_scales)
    "nvfp4_4over6": {"format": "nvfp4_4over6", "scales": "constant", "constant_scale": 0.002},
    "qa_mxfp4": {"format": "qa_mxfp4"},
    "fp8_e4m3": {"format": "fp8_e4m3", "scales": "static"},
    "fp8_e4m3_toward_zero": {"format": "fp8_e4m3", "scales": "constant", "constant_scale": 0.01,
                             "fp8_rounding": "toward_zero"},
    "fp8_e5m2": {"format": "fp8_e5m2", "scales": "constant", "constant_scale": 0.5},
    "qa_int8": {"format": "qa_int8"},
    "qa_int4": {"format": "qa_int4"},
    "none": {"format": "none"},
}


def _scales(fmt: str) -> KVScales:
    """Per-head static scales of one layer, two KV heads, as `qa calibrate` writes them."""
    k, v = torch.tensor([[1.0, 3.0]]), torch.tensor([[0.25, 6.0]])  # calibrated amax [L, H]
    meta = ScalesMeta(format=fmt, convention="decode", observer="absmax", granularity="head", num_layers=1,
                      num_kv_heads=H, model="m", data=CalibrationData(name="d", sha256="0", n_samples=1, seq_len=8),
                      seed=0)
    f = get_format(fmt)
    return KVScales(k_amax=k, v_amax=v, k_scale=f.decode_scale_from_amax(k), v_scale=f.decode_scale_from_amax(v),
                    meta=meta)


def _plan(name: str, *, mla: bool = False) -> LayerPlan:
    spec = KVQuantSpec.model_validate(SPECS[name])
    return layer_plan(spec, _scales(spec.format) if spec.scales == "static" else None, 0, mla=mla)


def _kv(t: int, seed: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K, V [T, H, D] bf16 and a slot mapping [T] with its last slot padded (-1), as under a CUDA graph."""
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(t, H, D, generator=g) * 3).to(torch.bfloat16)
    v = (torch.randn(t, H, D, generator=g) * torch.exp(torch.randn(t, H, 1, generator=g))).to(torch.bfloat16)
    slots = torch.arange(t, dtype=torch.int64)
    slots[-1:] = -1
    return k.to(device), v.to(device), slots.to(device)


def _step(plan: LayerPlan) -> Callable[..., Any]:
    """What the plugin runs per layer per step: the cache write's token count and K/V rewrite, and a rewrite
    that is not counted (an MLA prefill's fresh latent)."""

    def step(key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, ...]:
        count_tokens(plan, slots)
        k, v = rewrite_pair(plan, key, value)
        return k, v, rewrite(plan, key, "k", count=False)

    return step


class _HostTensors(TorchDispatchMode):
    """Records every op that builds a tensor from host data (lift_fresh: torch.tensor), leaves one on the CPU,
    or copies one from the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        cpu_in = any(isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() for t in tree_leaves(args))
        cpu_out = any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tree_leaves(out))
        if "lift_fresh" in str(func) or cpu_out or cpu_in and "copy" in str(func):
            self.found.append(str(func))
        return out


def _check_capture_safe(make: Callable[[LayerPlan], Callable[..., Any]], plan: LayerPlan, args: tuple,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The three checks: fullgraph trace, fake tensors, meta tensors (AssertionError or the op's error)."""
    torch._dynamo.reset()  # each check traces afresh (no cache entry of an earlier plan, no recompile limit)
    torch.compile(make(plan), fullgraph=True, backend="eager")(*args)  # a graph break raises
    monkeypatch.setenv(compiled.ENV, "0")  # the eager path below: what runs where no compiler does
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:  # a host read or a branch on values raises
        make(plan)(*(mode.from_tensor(a) for a in args))
    meta, meta_args = plan.to("meta"), [a.to("meta") for a in args]
    with _HostTensors() as seen:  # a host read raises on meta tensors; a tensor from host data is recorded
        make(meta)(*meta_args)
    assert not seen.found, f"tensors from or on the host per call: {seen.found}"
    monkeypatch.delenv(compiled.ENV)


@pytest.mark.parametrize("name", list(SPECS))
def test_the_per_call_path_of_every_format_is_capture_safe(name, monkeypatch):
    plan = _plan(name)
    k, v, slots = _kv(5, 0)
    _check_capture_safe(_step, plan, (k, v, slots), monkeypatch)
    _check_capture_safe(_step, plan, _kv(1, 1), monkeypatch)  # a decode step of one token


@pytest.mark.parametrize("check", ["fullgraph", "fake", "meta"])
def test_each_check_fails_on_a_path_that_reads_the_host(check, monkeypatch):
    """quantize_dequantize, the eager reference (it checks scales and inputs on the host per call), must fail
    every check: else the checks above could not fail."""
    for name in ("nvfp4", "fp8_e4m3", "qa_int8", "qa_mxfp4"):
        plan = _plan(name)

        def make(p: LayerPlan) -> Callable[..., Any]:
            return lambda key, value, slots: (quantize_dequantize(p.fmt, key, p.k_scale, key.dtype)[1],
                                              quantize_dequantize(p.fmt, value, p.v_scale, value.dtype)[1])

        args = _kv(3, 2)
        with pytest.raises(Exception):  # noqa: B017 - dynamo's, FakeTensorMode's or meta's own error
            if check == "fullgraph":
                torch.compile(make(plan), fullgraph=True, backend="eager")(*args)
            elif check == "fake":
                with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                    make(plan)(*(mode.from_tensor(a) for a in args))
            else:
                meta, meta_args = plan.to("meta"), [a.to("meta") for a in args]
                with _HostTensors() as seen:
                    make(meta)(*meta_args)
                assert not seen.found
        torch._dynamo.reset()


def test_a_traced_step_gives_the_eager_values_and_counts():
    plan = _plan("nvfp4")
    k, v, slots = _kv(6, 3)
    k[2, 1, 7] = float("nan")
    v[0, 0, 0] = float("-inf")
    want = _step(plan)(k, v, slots)
    traced = torch.compile(_step(plan), fullgraph=True, backend="aot_eager")(k, v, slots)
    for got, expect in zip(traced, want, strict=True):
        assert torch.equal(got.isnan(), expect.isnan()) and torch.equal(got.nan_to_num(), expect.nan_to_num())
    assert plan.counts.tolist() == [2 * 5, 2 * 2]  # each step: 5 slots >= 0, one NaN and one -Inf


def test_counters_count_written_tokens_and_non_finite_values():
    plan = _plan("fp8_e4m3")
    assert plan.counts.dtype == torch.int64 and plan.counts.tolist() == [0, 0]
    k, v, _ = _kv(4, 4)
    count_tokens(plan, torch.tensor([3, -1, 7, -1]))
    k[1, 0, 3], v[3, 1, 9], v[0, 0, 0] = float("nan"), float("inf"), float("nan")
    rewrite_pair(plan, k, v)
    assert plan.counts.tolist() == [2, 3]
    rewrite_pair(plan, k, v, count=False)
    rewrite(plan, k, "k", count=False)
    assert plan.counts.tolist() == [2, 3]
    rewrite(plan, v, "v")
    assert plan.counts.tolist() == [2, 5]
    moved = plan.to("cpu")
    assert moved.counts.tolist() == [0, 0] and moved.counts is not plan.counts  # fresh counters per install
    empty = torch.zeros(0, H, D, dtype=torch.bfloat16)
    out = rewrite_pair(plan, empty, empty)  # T = 0
    assert out[0] is empty and out[1] is empty and plan.counts.tolist() == [2, 5]
    count_tokens(plan, torch.zeros(0, dtype=torch.int64))
    assert plan.counts.tolist() == [2, 5]
    identity = _plan("none")
    out_k, out_v = rewrite_pair(identity, k, v)
    assert out_k is k and out_v is v and identity.counts.tolist() == [0, 3]  # unchanged, but counted


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit on finite values, NaN where the reference has NaN."""
    got, want = got.cpu(), want.cpu()
    nan = want.isnan()
    return torch.equal(got.isnan(), nan) and torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("use_compiled", [True, False])
@pytest.mark.parametrize("t", [8, 1])
def test_a_cuda_graph_replays_the_rewrite_bit_for_bit(name, use_compiled, t, monkeypatch):
    if not use_compiled:
        monkeypatch.setenv(compiled.ENV, "0")
    cpu_plan = _plan(name)
    plan = cpu_plan.to("cuda")
    k_in, v_in, slots_in = (x.clone() for x in _kv(t, 10, "cuda"))  # the graph's static inputs
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles (inductor, Triton) outside the capture
        for _ in range(2):
            _step(plan)(k_in, v_in, slots_in)
    torch.cuda.current_stream().wait_stream(side)
    plan.counts.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a host read or a host-to-device copy here raises
        out_k, out_v, out_latent = _step(plan)(k_in, v_in, slots_in)
    assert compiled.failure() is None  # the compiled case ran compiled (Triton), not eagerly after a failure
    monkeypatch.setenv(compiled.ENV, "0")  # the CPU references eagerly (the main suite: = the compiled CPU path)
    expect_bad = 0
    for replay in range(3):
        k, v, slots = _kv(t, 100 + replay)
        if replay == 2:  # non-finite values: written (NaN as NaN) and counted
            k[0, 1, 3], v[-1, 0, 60] = float("nan"), float("inf")
            expect_bad += 2
        k_in.copy_(k)
        v_in.copy_(v)
        slots_in.copy_(slots)
        graph.replay()
        torch.cuda.synchronize()
        want_k, want_v, want_latent = _step(cpu_plan)(k, v, slots)  # the CPU path
        if replay < 2:
            assert _same(want_k, quantize_dequantize(cpu_plan.fmt, k, cpu_plan.k_scale, k.dtype)[1])
        assert _same(out_k, want_k) and _same(out_v, want_v) and _same(out_latent, want_latent)
    assert plan.counts.tolist() == [3 * (t - 1), expect_bad]  # 3 replays, the padded slot not counted
