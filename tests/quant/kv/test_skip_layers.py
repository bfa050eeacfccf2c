"""skip_layers with vLLM 0.32's kv_cache_dtype_skip_layers semantics (quant.kv.skip_layers): what a spec may
write (one-line errors), a model's sliding-window layers read from its config as vLLM reads them, TurboQuant's
boundary layers, the resolution with its reasons, and the hf cache storing exactly the resolved layers
unquantized. The comparison with vLLM's own resolution is tests/evals/engines/vllm/kv/test_skip_layers_vllm.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from quant.errors import QuantError
from quant.kv.cache import make_cache
from quant.kv.shape import model_kv_shape
from quant.kv.skip_layers import (
    ModelLayers,
    config_layers,
    describe_layers,
    model_layers,
    ranges,
    resolve_skip_layers,
    sliding_mismatch,
    turboquant_boundary,
)
from quant.kv.spec import KVQuantSpec, kv_spec_from_dict
from tests.tiny_models import TINY_FAMILIES, tiny_family_config, tiny_gemma3_config, tiny_llama_config

# google/gemma-3-270m's config.json (the fields skip_layers reads): 18 layers, five local per global one
GEMMA3_270M: dict[str, Any] = {
    "model_type": "gemma3_text", "num_hidden_layers": 18, "sliding_window": 512,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
}
SMOLLM2: dict[str, Any] = {"model_type": "llama", "num_hidden_layers": 30}  # HuggingFaceTB/SmolLM2-135M: no window
GEMMA3_SLIDING = tuple(i for i in range(18) if i % 6 != 5)


def test_indices_names_and_digit_strings_parse_and_dump_as_written() -> None:
    spec = kv_spec_from_dict({"format": "nvfp4", "skip_layers": [0, "7", "sliding_window"]})
    assert spec.skip_layers == (0, "7", "sliding_window")
    assert spec.model_dump(mode="json")["skip_layers"] == [0, "7", "sliding_window"]
    assert KVQuantSpec.model_validate(spec.model_dump(mode="json")) == spec  # a dumped spec reads back


@pytest.mark.parametrize(("given", "message"), [
    ([-1], "skip_layers: layer index -1 is negative"),
    (["-2"], "skip_layers: layer index -2 is negative"),
    (["sliding"], "'sliding' is neither a layer index nor an attention type vLLM matches; did you mean 'sliding_window'?"),
    (["full_attention"], "'full_attention' is neither a layer index nor an attention type vLLM matches"),
    ([1, "1"], "skip_layers: layer '1' is listed twice"),
    ([1.0], "skip_layers: 1.0 is neither a layer index nor an attention type ('sliding_window')"),
    ([True], "skip_layers: True is neither a layer index"),
])
def test_what_vllm_would_ignore_or_misread_is_a_one_line_error(given: list[Any], message: str) -> None:
    with pytest.raises(QuantError) as err:
        kv_spec_from_dict({"skip_layers": given})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_digit_string_and_layer_formats_on_one_layer_is_refused() -> None:
    with pytest.raises(QuantError, match=r"layers \[3\] are both skipped and given a format"):
        kv_spec_from_dict({"skip_layers": ["3"], "layer_formats": {3: "qa_int4"}})


def test_model_layers_read_sliding_windows_as_vllm_does() -> None:
    gemma = model_layers(GEMMA3_270M)
    assert gemma.num_layers == 18 and not gemma.hybrid
    assert tuple(i for i, s in enumerate(gemma.sliding) if s) == GEMMA3_SLIDING
    assert not any(model_layers(SMOLLM2).sliding)
    # no layer_types and a window: vLLM's model-level CacheConfig.sliding_window, every layer
    assert all(model_layers({"num_hidden_layers": 4, "sliding_window": 4096}).sliding)
    # Qwen2's switch off, or a window of 0: no window at all
    assert not any(model_layers({"num_hidden_layers": 4, "sliding_window": 4096, "use_sliding_window": False}).sliding)
    assert not any(model_layers({"num_hidden_layers": 4, "sliding_window": 0}).sliding)
    # a multimodal config: its text_config
    assert model_layers({"text_config": GEMMA3_270M}).sliding == gemma.sliding
    with pytest.raises(QuantError, match="layer_types lists 2 layers, num_hidden_layers is 3"):
        model_layers({"num_hidden_layers": 3, "layer_types": ["full_attention"] * 2})
    with pytest.raises(QuantError, match="num_hidden_layers must be a positive integer, got None"):
        model_layers({})


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_sliding_layers_are_the_hf_caches_sliding_layers(family: str) -> None:
    """Every transformers family of the architecture matrix: the layers read here as sliding are the ones the hf
    cache gives a window (quant.kv.shape, transformers' own layer kwargs)."""
    config = tiny_family_config(family)
    shape = model_kv_shape(config, recurrent_ok=True)
    layers = config_layers(config)
    assert layers.sliding == tuple(w is not None for w in shape.sliding_windows)
    assert layers.attention_layers == shape.attention_layers


def test_turboquant_boundary_is_the_first_and_last_two_layers() -> None:
    assert turboquant_boundary(model_layers(SMOLLM2)) == (0, 1, 28, 29)
    assert turboquant_boundary(model_layers(GEMMA3_270M)) == (0, 1, 16, 17)
    assert turboquant_boundary(ModelLayers(("full_attention",) * 3, (False,) * 3)) == (0, 2)  # at most half: n = 1
    assert turboquant_boundary(ModelLayers(("full_attention",), (False,))) == ()
    hybrid = ModelLayers(("linear_attention", "full_attention"), (False, False))
    assert hybrid.hybrid and turboquant_boundary(hybrid) == ()  # vLLM keeps no boundary on hybrids
    with pytest.raises(QuantError, match="hybrid model has none"):
        turboquant_boundary(ModelLayers(("linear_attention", "conv"), (False, False)))


def test_resolution_merges_reasons_and_checks_the_model() -> None:
    gemma = model_layers(GEMMA3_270M)
    skips = resolve_skip_layers([5, "sliding_window"], "turboquant_4bit_nc", gemma)
    assert skips.reasons[0] == ("sliding_window", "turboquant_boundary")
    assert skips.reasons[5] == ("skip_layers",) and skips.reasons[17] == ("turboquant_boundary",)
    assert skips.kept(range(18)) == (11,)
    assert resolve_skip_layers(["sliding_window"], "nvfp4", model_layers(SMOLLM2)).reasons == {}
    with pytest.raises(QuantError, match=r"names layer 30, but the model has 30 layers \(0\.\.29\)"):
        resolve_skip_layers(["30"], "nvfp4", model_layers(SMOLLM2))
    with pytest.raises(QuantError, match=r"layer 0 is kept unquantized \(TurboQuant boundary, vLLM adds it\) and "
                                         "given a format in layer_formats"):
        kv_spec_from_dict({"format": "turboquant_4bit_nc", "layer_formats": {0: "qa_int4"}}).layer_skips(gemma)


def test_ultraquant_keeps_turboquants_boundary() -> None:
    # engine/arg_utils.py adds TurboQuantConfig.get_boundary_skip_layers for ultraquant_4bit as for turboquant_*
    skips = KVQuantSpec(format="ultraquant_4bit").layer_skips(model_layers(SMOLLM2))
    assert skips.reasons == {i: ("turboquant_boundary",) for i in (0, 1, 28, 29)}


def test_layer_format_needs_the_model_when_the_spec_does() -> None:
    assert KVQuantSpec(format="nvfp4", skip_layers=(2, "3")).layer_format(3) == "none"
    for spec in (KVQuantSpec(format="nvfp4", skip_layers=("sliding_window",)), KVQuantSpec(format="turboquant_k8v4")):
        with pytest.raises(QuantError, match="resolve them against the model"):
            spec.layer_format(0)
    spec = KVQuantSpec(format="turboquant_k8v4")
    skips = spec.layer_skips(model_layers(SMOLLM2))
    assert [spec.layer_format(i, skips) for i in (0, 1, 2, 27, 28, 29)] == ["none", "none", *["turboquant_k8v4"] * 2,
                                                                         "none", "none"]


def test_describe_layers_says_what_is_quantized_and_why_the_rest_is_not() -> None:
    gemma = model_layers(GEMMA3_270M)
    spec = KVQuantSpec(format="turboquant_4bit_nc", skip_layers=(11,), layer_formats={5: "fp8_e4m3"})
    assert describe_layers(spec.layer_skips(gemma), gemma, spec.format, spec.layer_formats) == (
        "18 KV layers: turboquant_4bit_nc on 2-4, 6-10, 12-15; fp8_e4m3 on 5; skipped (spec skip_layers): 11; "
        "skipped (TurboQuant boundary, vLLM adds it): 0-1, 16-17")
    plain = KVQuantSpec(format="nvfp4")
    assert describe_layers(plain.layer_skips(gemma), gemma, "nvfp4", {}).endswith("nvfp4 on 0-17; none skipped")
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8" and ranges([]) == ""


def test_sliding_mismatch_names_a_layer_the_engine_runs_otherwise() -> None:
    gemma = model_layers(GEMMA3_270M)
    skips = resolve_skip_layers(["sliding_window"], "nvfp4", gemma)
    assert sliding_mismatch(["sliding_window"], skips, 0, engine_sliding=True) is None
    assert sliding_mismatch(["sliding_window"], skips, 5, engine_sliding=False) is None
    assert "layer 5 is not a sliding-window layer" in str(sliding_mismatch(["sliding_window"], skips, 5, True))
    assert sliding_mismatch([5], resolve_skip_layers([5], "nvfp4", gemma), 0, engine_sliding=True) is None


def test_hf_cache_keeps_exactly_the_resolved_layers_unquantized() -> None:
    gemma = tiny_gemma3_config()  # layer 0 sliding, layer 1 full
    cache = make_cache(gemma, KVQuantSpec(format="qa_int4", skip_layers=("sliding_window",)))
    assert [layer.format for layer in cache.layers] == ["none", "qa_int4"]
    llama = tiny_llama_config(num_hidden_layers=6)
    cache = make_cache(llama, KVQuantSpec(format="turboquant_k8v4", skip_layers=("2",)))
    assert [layer.format for layer in cache.layers] == ["none", "none", "none", "turboquant_k8v4", "none", "none"]
    with torch.no_grad(), pytest.raises(QuantError, match="names layer 6, but the model has 6 layers"):
        make_cache(llama, KVQuantSpec(format="qa_int4", skip_layers=(6,)))
