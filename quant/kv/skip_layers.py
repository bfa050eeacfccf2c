"""Which layers a KV spec keeps unquantized, resolved once per model as vLLM 0.32 resolves its
`kv_cache_dtype_skip_layers` (torch-free: the model is described by its config as a plain dict).

vLLM takes a list of strings (config/cache.py): a layer index ("0") skips that layer, matched as
`str(extract_layer_index(prefix))` (model_executor/layers/attention/attention.py, mla_attention.py);
"sliding_window" skips every Attention layer that runs with a sliding window (Attention.__init__: the
layer's own window, else CacheConfig.sliding_window, which engine/arg_utils.py sets only when the config has
no `layer_types` or all of them are sliding; MLA layers match indices only). vLLM ignores any other string
without a word, so here it is a one-line error. A spec may write an index as an int or, as vLLM does, as a
string of digits. A TurboQuant cache (kv_cache_dtype `turboquant_*` or `ultraquant_4bit`) adds its boundary
layers (engine/arg_utils.py, TurboQuantConfig.get_boundary_skip_layers): the first and last two layers of a
dense model (at most half of them), none on a hybrid (attention + recurrent) model.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from quant.errors import QuantError
from quant.validation import did_you_mean

SkipLayerName = Literal["sliding_window"]  # the attention-type names vLLM 0.32's Attention.__init__ matches
SKIP_LAYER_NAMES: tuple[str, ...] = get_args(SkipLayerName)
SkipReason = Literal["skip_layers", "sliding_window", "turboquant_boundary"]
TURBOQUANT_BOUNDARY = 2  # get_boundary_skip_layers(model_config, n=2): the engine passes no other n
# layer types an attention KV cache serves (a config's `layer_types` / `layers_block_type`); any other type
# (linear_attention, conv, mamba, ...) makes the model hybrid
ATTENTION_LAYER_TYPES: tuple[str, ...] = (
    "full_attention", "attention", "sliding_attention", "chunked_attention", "hybrid",
)
FULL_ATTENTION_TYPES: tuple[str, ...] = ("full_attention", "attention", "hybrid")  # _get_full_attention_layer_indices


def skip_index(entry: int | str) -> int | None:
    """The layer index an entry names (an int, or a string of digits as vLLM takes it); None for a name."""
    if isinstance(entry, int):
        return entry
    return int(entry) if entry.isdigit() else None


def check_skip_entries(entries: Sequence[int | str]) -> None:
    """ValueError (one line) unless every entry is a layer index >= 0 or a name vLLM matches, none twice."""
    seen: set[int | str] = set()
    for entry in entries:
        if isinstance(entry, bool) or not isinstance(entry, int | str):
            raise ValueError(  # noqa: TRY004 - a spec validator: pydantic reports only ValueError in one line
                f"{entry!r} is neither a layer index nor an attention type ('sliding_window')")
        index = skip_index(entry)
        if index is not None and index < 0 or isinstance(entry, str) and entry.startswith("-"):
            raise ValueError(f"layer index {entry} is negative")
        if index is None and entry not in SKIP_LAYER_NAMES:
            raise ValueError(f"{entry!r} is neither a layer index nor an attention type vLLM matches; "
                             f"{did_you_mean(str(entry), SKIP_LAYER_NAMES, listing='names')}")
        key = entry if index is None else index
        if key in seen:
            raise ValueError(f"layer {entry!r} is listed twice: {list(entries)}")
        seen.add(key)


def skip_indices(entries: Sequence[int | str]) -> tuple[int, ...]:
    """The layer indices among the entries (names dropped), as ints, in the order written."""
    return tuple(i for i in map(skip_index, entries) if i is not None)


def adds_boundary(cache_format: str) -> bool:
    """Whether a cache of `cache_format` keeps TurboQuant's boundary layers unquantized (engine/arg_utils.py)."""
    return cache_format.startswith("turboquant_") or cache_format == "ultraquant_4bit"


def needs_model(entries: Sequence[int | str], cache_format: str) -> bool:
    """Whether the skipped layers depend on the model (an attention-type name, or TurboQuant's boundary)."""
    return adds_boundary(cache_format) or any(skip_index(e) is None for e in entries)


@dataclass(frozen=True)
class ModelLayers:
    """A model's decoder layers as vLLM tells them apart for skip_layers: type and sliding window."""

    layer_types: tuple[str, ...]  # per layer: the config's layer_types (else "full_attention")
    sliding: tuple[bool, ...]  # per layer: vLLM runs it with a sliding window

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers that hold a KV cache (not a recurrent state)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t in ATTENTION_LAYER_TYPES)

    @property
    def hybrid(self) -> bool:
        """Whether some layer is not attention (vLLM's ModelConfig.is_hybrid for these configs)."""
        return any(t not in ATTENTION_LAYER_TYPES for t in self.layer_types)


def model_layers(config: Mapping[str, Any]) -> ModelLayers:
    """The layers of a model from its config as a dict (config.json, or a transformers config's to_dict(); a
    multimodal config's text_config is read); QuantError (one line) for a config without its layer count."""
    text = config.get("text_config")
    text = text if isinstance(text, Mapping) else config
    n = text.get("num_hidden_layers")
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise QuantError(f"model config: num_hidden_layers must be a positive integer, got {n!r}")
    window = text.get("sliding_window")
    if text.get("use_sliding_window") is False or window == 0:  # Qwen2's switch; 0 means none (config/model.py)
        window = None
    given = text.get("layer_types") or text.get("layers_block_type")
    if given is None:
        types = ("full_attention",) * n
        return ModelLayers(types, (window is not None,) * n)  # vLLM's model-level window: every layer
    types = tuple(str(t) for t in given)
    if len(types) != n:
        raise QuantError(f"model config: layer_types lists {len(types)} layers, num_hidden_layers is {n}")
    if all(t == "sliding_attention" for t in types):
        return ModelLayers(types, (window is not None,) * n)
    return ModelLayers(types, tuple(t == "sliding_attention" and window is not None for t in types))


CONFIG_KEYS: tuple[str, ...] = (
    "num_hidden_layers", "layer_types", "layers_block_type", "sliding_window", "use_sliding_window",
)


def config_layers(config: Any) -> ModelLayers:
    """model_layers of a config object (a transformers text config, whose attribute aliases such as GPT-2's
    n_layer -> num_hidden_layers it resolves itself)."""
    return model_layers({key: getattr(config, key, None) for key in CONFIG_KEYS})


def turboquant_boundary(layers: ModelLayers, n: int = TURBOQUANT_BOUNDARY) -> tuple[int, ...]:
    """TurboQuant's boundary layers as vLLM's get_boundary_skip_layers computes them (module docstring);
    QuantError for a hybrid model without full-attention layers (vLLM raises NotImplementedError)."""
    if layers.hybrid:
        if not any(t in FULL_ATTENTION_TYPES for t in layers.layer_types):
            raise QuantError("a TurboQuant KV cache needs full-attention layers; this hybrid model has none")
        return ()
    n = min(n, layers.num_layers // 2)  # vLLM: never more than half the layers
    if n <= 0:
        return ()
    return tuple(sorted({*range(n), *range(layers.num_layers - n, layers.num_layers)}))


@dataclass(frozen=True)
class LayerSkips:
    """The layers one spec keeps unquantized on one model, each with why (the spec's index, its
    "sliding_window", TurboQuant's boundary)."""

    num_layers: int
    reasons: Mapping[int, tuple[SkipReason, ...]]  # skipped layer -> why, in SkipReason order

    @property
    def skipped(self) -> frozenset[int]:
        return frozenset(self.reasons)

    def kept(self, layers: Collection[int]) -> tuple[int, ...]:
        """Of `layers`, those not skipped, in order."""
        return tuple(i for i in sorted(layers) if i not in self.reasons)


def resolve_skip_layers(entries: Sequence[int | str], cache_format: str, layers: ModelLayers, *,
                        formatted: Collection[int] = ()) -> LayerSkips:
    """The layers `entries` (a spec's skip_layers) and a `cache_format` cache keep unquantized on the model
    `layers` describes; QuantError for an index the model lacks or a skipped layer `formatted` (the spec's
    layer_formats) gives a format."""
    reasons: dict[int, list[SkipReason]] = {}
    for index in skip_indices(entries):
        if index >= layers.num_layers:
            raise QuantError(f"kv cache spec names layer {index}, but the model has {layers.num_layers} layers "
                             f"(0..{layers.num_layers - 1})")
        reasons.setdefault(index, []).append("skip_layers")
    if "sliding_window" in entries:
        for i in (i for i, s in enumerate(layers.sliding) if s):
            reasons.setdefault(i, []).append("sliding_window")
    if adds_boundary(cache_format):
        for i in turboquant_boundary(layers):
            reasons.setdefault(i, []).append("turboquant_boundary")
    clash = sorted(set(reasons) & set(formatted))
    if clash:
        why = ", ".join(describe_reason(r) for r in reasons[clash[0]])
        raise QuantError(f"kv cache spec: layer {clash[0]} is kept unquantized ({why}) and given a format in "
                         "layer_formats; drop one")
    order = get_args(SkipReason)
    return LayerSkips(layers.num_layers, {i: tuple(sorted(set(r), key=order.index)) for i, r in sorted(reasons.items())})


def describe_reason(reason: SkipReason) -> str:
    """A skip reason in words."""
    return {"skip_layers": "spec skip_layers", "sliding_window": "spec skip_layers 'sliding_window'",
            "turboquant_boundary": "TurboQuant boundary, vLLM adds it"}[reason]


def ranges(layers: Sequence[int]) -> str:
    """Layer indices as runs: (0, 1, 2, 5) -> '0-2, 5'; '' for none."""
    runs: list[list[int]] = []
    for i in sorted(layers):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def describe_layers(skips: LayerSkips, layers: ModelLayers, cache_format: str,
                    layer_formats: Mapping[int, str]) -> str:
    """One line: the model's KV layers a spec quantizes (by format) and those it skips, and why."""
    kept = skips.kept(layers.attention_layers)
    by_format: dict[str, list[int]] = {}
    for i in kept:
        by_format.setdefault(layer_formats.get(i, cache_format), []).append(i)
    parts = [f"{name} on {ranges(idx)}" if name != "none" else f"none (unquantized) on {ranges(idx)}"
             for name, idx in by_format.items()] or ["no layer quantized"]
    for reason in get_args(SkipReason):
        named = [i for i, r in skips.reasons.items() if reason in r]
        if named:
            parts.append(f"skipped ({describe_reason(reason)}): {ranges(named)}")
    if not skips.reasons:
        parts.append("none skipped")
    return f"{len(layers.attention_layers)} KV layers: " + "; ".join(parts)


def sliding_mismatch(entries: Sequence[int | str], skips: LayerSkips, layer: int, engine_sliding: bool) -> str | None:
    """Why layer `layer` would be skipped otherwise than the engine skips it ("sliding_window" resolved from the
    config here, the engine's own layer running with a sliding window or not: `engine_sliding`), else None."""
    if "sliding_window" not in entries or engine_sliding == ("sliding_window" in skips.reasons.get(layer, ())):
        return None
    ours = "a sliding-window layer" if not engine_sliding else "not a sliding-window layer"
    return (f"layer {layer} is {ours} by the model config but the engine runs it "
            f"{'with' if engine_sliding else 'without'} a sliding window, so skip_layers 'sliding_window' "
            "would skip other layers than the native flag does")
