"""Folders llm-compressor 0.14.0.1 itself writes (tests.llmc_folders: oneshot on 16 WikiText-2 lines of
SmolLM2-135M-Instruct in .venv-llmc), read by quant.scales.folder.resolve_folder_scales: what the writer
stores is compressed-tensors' amax / (range / 2) (FP8: amax/448, 4-bit float: amax/6; per tensor, and FP8
per KV head with strategy attn_head), the folder declares that, the fit on other WikiText-2 prompts agrees,
and the emulated NVFP4 cache reads each converted to amax/2688; the group-of-16 NVFP4 schemes are refused by
the writer itself."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from evals.models.load import load_model
from evals.models.resolve import resolve_model
from qa.pipeline.calibration import load_prompts
from quant.kv.cache import make_cache
from quant.kv.scale_check import observe_amax
from quant.kv.spec import kv_spec_from_dict
from quant.scales.files import KVScales
from quant.scales.folder import read_folder_scales, resolve_folder_scales
from tests.llmc_folders import LlmcFolders, llmc_folders
from tests.shared_data import shared_data_dir

pytestmark = pytest.mark.slow
torch.set_num_threads(1)

PER_AMAX = {"fp8": 448.0, "fp4": 6.0, "fp8-head": 448.0}  # compressed-tensors calculate_range: FP8_E4M3, FP4_E2M1 max
DECLARED = {"fp8": "fp8-decode", "fp4": "nvfp4-global", "fp8-head": "fp8-decode"}
WRITTEN = tuple(PER_AMAX)  # the schemes llm-compressor 0.14.0.1 writes
KV_HEADS = 3  # SmolLM2-135M: num_key_value_heads


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> LlmcFolders:
    return llmc_folders(tmp_path_factory)


@pytest.fixture(scope="module")
def observed(made: LlmcFolders):  # -> ObservedAmax
    """amax of SmolLM2's K/V here, on other WikiText-2 chunks than the writer's (the preflight's fit)."""
    model, tokenizer = load_model(resolve_model(str(made.model)), dtype="float32", device="cpu")
    name, prompts = load_prompts(tokenizer, "wikitext2", shared_data_dir("wikitext2"), 4, 128, 0)
    return observe_amax(model, prompts, f"smollm2 on {name}: 4 x 128 tokens")


@pytest.mark.parametrize("scheme", WRITTEN)
def test_the_writer_stores_amax_over_half_its_range(made: LlmcFolders, scheme: str) -> None:
    fs = read_folder_scales(made.folder(scheme))
    amax = made.amax(scheme)  # what llm-compressor's default (moving-average minmax) observer arrived at
    heads = KV_HEADS if scheme == "fp8-head" else 1
    assert fs.num_layers == 30 and fs.per_head is (heads > 1)
    for kind, stored in (("k", fs.k), ("v", fs.v)):
        for i, per in enumerate(stored):  # amax per layer: one number, or one per KV head (attn_head)
            want = amax[kind][i] if heads > 1 else [amax[kind][i]]
            assert len(per) == heads
            assert list(per) == pytest.approx([a / PER_AMAX[scheme] for a in want], rel=1e-3)  # 448 vs 6: 75x
    # the same observer on the same batches: only the divisor differs, to float32 precision
    fp4, fp8 = read_folder_scales(made.folder("fp4")), read_folder_scales(made.folder("fp8"))
    ratios = [a[0] / b[0] for a, b in zip((*fp4.k, *fp4.v), (*fp8.k, *fp8.v), strict=True)]
    assert ratios == pytest.approx([448 / 6] * 60, rel=1e-6)
    # attn_head keeps each KV head's own number (no broadcast of the per-tensor one)
    head = read_folder_scales(made.folder("fp8-head"))
    assert all(len(set(per)) == KV_HEADS for per in (*head.k, *head.v))


def test_the_writer_refuses_group_of_16_nvfp4(made: LlmcFolders) -> None:
    assert all(made.refused(scheme) is None for scheme in WRITTEN)
    static = made.refused("nvfp4-group")
    assert static is not None and static.startswith("TypeError: empty(): argument 'size' failed to unpack")
    assert made.refused("nvfp4-local") == "ValueError: Group quantization cannot be applied to attention"
    assert not made.folder("nvfp4-group").exists() and not made.folder("nvfp4-local").exists()


@pytest.mark.parametrize("scheme", WRITTEN)
def test_the_folder_declares_what_it_stores_and_the_fit_agrees(made: LlmcFolders, observed, scheme: str) -> None:
    rs = resolve_folder_scales(made.folder(scheme), "nvfp4", observed=observed)
    assert rs.declared.name == DECLARED[scheme] and rs.problems == ()
    assert rs.fit is not None and rs.fit.convention == DECLARED[scheme] and 0.5 < rs.fit.ratio < 2.0
    bits, strategy = (4, "tensor") if scheme == "fp4" else (8, "attn_head" if scheme == "fp8-head" else "tensor")
    assert rs.scales.declared_by.startswith(f"compressed-tensors kv_cache_scheme num_bits={bits} float {strategy} ")
    assert rs.scales.vllm_loads is (bits == 8)  # vLLM 0.32 refuses a 4-bit compressed-tensors KV scheme
    stored = rs.scales.k
    assert rs.k_decode is not None
    for xs, ds in zip(stored, rs.k_decode, strict=True):  # amax = stored * (range / 2); NVFP4 reads amax/2688
        assert list(ds) == pytest.approx([x * PER_AMAX[scheme] / 2688 for x in xs], rel=1e-12)
    as_fp8 = resolve_folder_scales(made.folder(scheme), "fp8_e4m3", observed=observed)
    assert as_fp8.k_decode is not None
    for xs, ds in zip(stored, as_fp8.k_decode, strict=True):
        assert list(ds) == pytest.approx([x * PER_AMAX[scheme] / 448 for x in xs], rel=1e-12)


@pytest.mark.parametrize("scheme", WRITTEN)
def test_the_emulated_cache_stores_with_the_converted_scales(made: LlmcFolders, scheme: str) -> None:
    folder = made.folder(scheme)
    spec = kv_spec_from_dict({"format": "nvfp4", "scales": str(folder)})
    cache = make_cache(AutoConfig.from_pretrained(folder), spec)
    fs = read_folder_scales(folder)
    loaded = KVScales.load(folder, kv_format="nvfp4")
    for i, layer in enumerate(cache.layers):
        # quant.kv.cache reads the folder for the spec's format (quant.kv.cache.spec_scales: KVScales.load(DIR,
        # kv_format=spec.format)): the very scales resolved for nvfp4, one per layer or one per KV head
        assert torch.equal(layer.k.scale.reshape(-1), loaded.k_scale[i].reshape(-1))
        assert torch.equal(layer.v.scale.reshape(-1), loaded.v_scale[i].reshape(-1))
        assert layer.k.scale.reshape(-1).tolist() == pytest.approx([x * PER_AMAX[scheme] / 2688 for x in fs.k[i]],
                                                                   rel=1e-6)
        assert layer.v.scale.reshape(-1).tolist() == pytest.approx([x * PER_AMAX[scheme] / 2688 for x in fs.v[i]],
                                                                   rel=1e-6)
