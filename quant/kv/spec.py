"""KVQuantSpec: the validated description of an emulated KV cache (format per layer, scales, recent window).

Parsed once at the boundary (TOML / CLI / fault presets) into a frozen model; unknown keys are errors.
The fault-injection fields (`scale_multiplier`, `v_scale_layout`, `corrupt_block_fraction`) default to
a correct cache; `quant.kv.faults` names presets built from them. `prefix_cache` (PrefixCacheSpec) is read
by the hf engine only (evals.engines.hf.prefix_cache); the caches built here ignore it. Names are
checked against quant.formats.catalog, so validating a spec loads no torch.

`scales` is a mode or a model folder: `scales = "DIR"` reads the K/V scales DIR carries (quant.scales.folder:
this toolkit's export, llm-compressor's, ModelOpt's), checked here once (a one-line error for a folder without
scales or in an unknown convention), and stands for `scales = "static", scales_file = "DIR"`, the form the
spec is dumped in (so re-reading a dumped spec never touches the folder). `scales_as_is = true` runs a
folder's scales as it declares them even where `qa run` would refuse them (all 1.0, or numbers that fit
another convention than declared: quant.scales.folder.resolve_folder_scales); dumped only when set.

Where a spec crosses a process boundary (resolved.json, the qa_kv plugin's QA_VLLM_KV variable) it is written
by `kv_spec_to_json` and read back by `kv_spec_from_json`, one pair for every such place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    StrictInt,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from quant.errors import QuantError
from quant.formats.catalog import (
    PROFILE_ONLY_FORMATS,
    FP8Rounding,
    QueryRounding,
    check_format_name,
    get_profile,
)
from quant.kv.skip_layers import (
    LayerSkips,
    ModelLayers,
    check_skip_entries,
    needs_model,
    resolve_skip_layers,
    skip_indices,
)
from quant.scales.folder import resolve_folder_scales
from quant.validation import did_you_mean, first_error

ScaleMode = Literal["dynamic", "static", "constant"]
SCALE_MODES: tuple[str, ...] = get_args(ScaleMode)
ScaleLayout = Literal["linear", "transposed", "reversed"]
KVKind = Literal["k", "v"]  # which of a layer's two cached tensors
AttentionIOFormat = Literal["fp8_e4m3"]  # what a kernel rounds Q (or its output) to: FP8 E4M3, scale 1.0

# Formats whose stored bytes include per-block scale bytes (`data["scales"]`, one per block of head_dim).
BLOCK_SCALED_FORMATS: tuple[str, ...] = ("nvfp4", "nvfp4_4over6", "qa_mxfp4")
# Formats whose element codes are plain bytes that any random value can replace (no NaN encodings).
CORRUPTIBLE_FORMATS: tuple[str, ...] = ("nvfp4", "nvfp4_4over6", "qa_mxfp4", "qa_int4", "qa_int8")


def _check_profile(spec: KVQuantSpec) -> None:
    """ValueError unless the spec's formats, scales and options are what its engine profile does."""
    used = sorted({spec.format, *spec.layer_formats.values()} - {"none"})
    if spec.profile is None:
        io = [k for k in ("query_format", "output_format") if getattr(spec, k) is not None]
        if io and spec.format == "none":
            raise ValueError(f"{io[0]} rounds what attention reads or writes beside a quantized cache; "
                             "format 'none' quantizes nothing")
        only = [name for name in used if name in PROFILE_ONLY_FORMATS]
        if only:
            raise ValueError(f"format {only[0]!r} is llama.cpp's: set profile = 'llamacpp'")
        return
    p = get_profile(spec.profile)
    given = [k for k in ("fp8_rounding", "query_format", "output_format") if k in spec.model_fields_set]
    if given:
        raise ValueError(f"profile {p.name!r} decides how the engine rounds; drop {given[0]}")
    other = [name for name in used if name not in p.formats]
    if other:
        raise ValueError(f"profile {p.name!r} stores {', '.join(p.formats)} (or none), not {other[0]!r}")
    if spec.recent_window:
        raise ValueError(f"profile {p.name!r}: the engine keeps no recent window; set recent_window = 0")
    if not spec.prefill_reads_quantized:
        raise ValueError(f"profile {p.name!r}: the engine's prefill reads the cache; drop prefill_reads_quantized")
    if p.amx_flush and (spec.scales != "constant" or spec.layer_formats or spec.skip_layers):
        raise ValueError(
            f"profile {p.name!r} models one k_scale = v_scale for every layer (vLLM's default 1.0): set "
            "scales = 'constant', constant_scale = 1.0 and no layer_formats / skip_layers"
        )
    unit = [name for name in used if name in p.unit_scale_formats]
    if unit and not (spec.scales == "constant" and spec.constant_scale == 1):
        raise ValueError(
            f"profile {p.name!r} stores {unit[0]} without a tensor scale: set scales = 'constant', constant_scale = 1.0"
        )


class PrefixCacheSpec(BaseModel):
    """The hf engine's prefix cache (`kv.prefix_cache`): served prompts' KV kept in the arm's cache format
    and reused by later prompts that extend them (evals.engines.hf.prefix_cache says how)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    # on a hit of P cached positions, positions [P - replay_window, P) are recomputed from the cached
    # earlier ones instead of read (bounded replay); 0 reads all P
    replay_window: int = Field(default=0, ge=0)
    # hits are whole blocks (entries are kept at whole blocks); prompts are prefilled in passes of up to the
    # engine's prefill_chunk tokens from the first uncached position (evals.engines.hf.args)
    block: int = Field(default=64, ge=1)
    max_tokens: int = Field(default=16384, ge=1)  # cached positions kept (least recently used dropped first)

    @model_validator(mode="after")
    def _read_only_when_enabled(self) -> PrefixCacheSpec:
        if not self.enabled:
            set_ = sorted(self.model_fields_set - {"enabled"})
            if set_:
                raise ValueError(f"{set_[0]} is read only when enabled = true")
        return self


class KVQuantSpec(BaseModel):
    """How the emulated KV cache stores K and V; defaults: a dynamic-scale NVFP4 cache on every layer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = "nvfp4"  # format of every layer not named in layer_formats / skip_layers
    layer_formats: dict[int, str] = Field(default_factory=dict)  # per-layer override: {layer index: format}
    # kept unquantized (format "none") as vLLM's kv_cache_dtype_skip_layers: layer indices (an int or a string
    # of digits) and "sliding_window", resolved per model with TurboQuant's boundary (quant.kv.skip_layers)
    skip_layers: tuple[StrictInt | str, ...] = ()
    # dynamic: per-sequence amax of the first write of each layer (the prefill), reused for later tokens;
    # static: calibrated amax per layer (and head) from `scales_file` or a KVScales passed to make_cache;
    # constant: `constant_scale` as the decode scale of every layer (vLLM's uncalibrated default 1.0);
    # a model folder's path: static, the scales that folder carries (see the module docstring)
    scales: ScaleMode = "dynamic"
    scales_file: Path | None = None
    scales_as_is: bool = False  # a folder's scales run as declared even when refused (module docstring)
    # `float | int`: a value written as 1 stays 1, so arm.json fingerprints what the spec wrote
    constant_scale: float | int | None = None
    recent_window: int = Field(default=0, ge=0)  # last N positions kept in recent_format (0 = no window)
    recent_format: str = "fp8_e4m3"
    prefill_reads_quantized: bool = True  # False: a multi-token write attends to its fresh K/V
    # fault hooks: defaults are a correct cache
    scale_multiplier: float | int = Field(default=1.0, gt=0)  # every decode scale times this (10.0: 10x too large)
    v_scale_layout: ScaleLayout = "linear"  # how V block-scale bytes of a token are read back (see quant.kv.faults)
    corrupt_block_fraction: float | int = Field(
        default=0.0, ge=0.0, lt=1.0
    )  # share of 16-element blocks with random codes
    corrupt_seed: int = 0
    # engine profile (quant.kv.profiles): None = the emulator's own rounding; written to dumps only when set
    profile: str | None = None
    # without a profile, what a native kernel does around the cache (each written to dumps only when set):
    # FP8 K/V codes rounded to nearest (CUDA's casts) or toward zero (vLLM-CPU's cache write, x * (1/d));
    # Q rounded to FP8 E4M3 (scale 1.0) before Q K^T, and the attention output to FP8 E4M3, as vLLM's SM100
    # trtllm-gen NVFP4 path does (v1/attention/backends/flashinfer.py: FP8 query, FP8 output buffer)
    fp8_rounding: FP8Rounding = "nearest"
    query_format: AttentionIOFormat | None = None
    output_format: AttentionIOFormat | None = None
    # the hf engine's prefix cache (None: none); written to dumps only when set
    prefix_cache: PrefixCacheSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _scales_folder(cls, data: Any) -> Any:
        """`scales = "DIR"` -> static scales from the folder, checked here (module docstring)."""
        if not isinstance(data, dict):
            return data
        given = data.get("scales")
        if not isinstance(given, str | Path) or str(given) in SCALE_MODES:
            return data
        folder = Path(given)
        if not folder.is_dir():
            hint = did_you_mean(str(given), SCALE_MODES, listing="or one of")
            raise ValueError(f"scales {str(given)!r}: not a model folder; {hint}")
        if data.get("scales_file") is not None:
            raise ValueError("scales = a folder names the scales itself; drop scales_file")
        # QuantError (a ValueError): no scales, in an unknown convention, or refused (all 1.0) unless taken as is
        resolve_folder_scales(folder, str(data.get("format", "nvfp4")), take_as_is=data.get("scales_as_is") is True)
        return {**data, "scales": "static", "scales_file": folder}

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, name: str | None) -> str | None:
        if name is not None:
            get_profile(name)
        return name

    @model_serializer(mode="wrap")
    def _dump_profile_when_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if self.profile is None:
            data.pop("profile", None)  # specs without a profile dump (and fingerprint) as before
        if self.prefix_cache is None:
            data.pop("prefix_cache", None)  # likewise specs without a prefix cache
        if not self.scales_as_is:
            data.pop("scales_as_is", None)  # likewise specs that take no folder as it is
        for key, default in (("fp8_rounding", "nearest"), ("query_format", None), ("output_format", None)):
            if data.get(key) == default:
                data.pop(key, None)  # likewise specs that keep the emulator's own rounding
        return data

    @field_validator("format", "recent_format")
    @classmethod
    def _known_format(cls, name: str) -> str:
        check_format_name(name)
        return name

    @field_validator("layer_formats")
    @classmethod
    def _known_layer_formats(cls, formats: dict[int, str]) -> dict[int, str]:
        for layer, name in formats.items():
            if layer < 0:
                raise ValueError(f"layer_formats: layer index {layer} is negative")
            check_format_name(name)
        return formats

    @field_validator("skip_layers", mode="before")
    @classmethod
    def _valid_skip_layers(cls, layers: Any) -> Any:
        if isinstance(layers, list | tuple):
            check_skip_entries(layers)  # before the types: one message for a float, a bool or a bad name
        return layers

    @model_validator(mode="after")
    def _consistent(self) -> KVQuantSpec:
        if self.scales == "constant" and self.constant_scale is None:
            raise ValueError("scales = 'constant' needs constant_scale (a decode scale, e.g. 1.0)")
        if self.scales != "constant" and self.constant_scale is not None:
            raise ValueError("constant_scale is only used with scales = 'constant'")
        if self.constant_scale is not None and not (0 < self.constant_scale < float("inf")):
            raise ValueError(f"constant_scale must be positive and finite, got {self.constant_scale}")
        if self.scales_file is not None and self.scales != "static":
            raise ValueError("scales_file is only used with scales = 'static'")
        if self.scales_as_is and self.scales_file is None:
            raise ValueError("scales_as_is is read only with scales = a model folder (scales = \"DIR\")")
        overlap = sorted(set(skip_indices(self.skip_layers)) & set(self.layer_formats))
        if overlap:
            raise ValueError(f"layers {overlap} are both skipped and given a format in layer_formats")
        used = {self.format, *self.layer_formats.values()}
        if self.v_scale_layout != "linear" and not used & set(BLOCK_SCALED_FORMATS):
            raise ValueError(
                f"v_scale_layout = {self.v_scale_layout!r} needs a block-scaled format "
                f"({', '.join(BLOCK_SCALED_FORMATS)})"
            )
        if self.corrupt_block_fraction > 0 and not used & set(CORRUPTIBLE_FORMATS):
            raise ValueError(
                f"corrupt_block_fraction needs one of the formats {', '.join(CORRUPTIBLE_FORMATS)}"
            )
        _check_profile(self)
        return self

    def query_rounding(self) -> QueryRounding:
        """What Q is rounded to before Q K^T: the profile's choice, else query_format, else "none"."""
        if self.profile is not None:
            return get_profile(self.profile).query
        return self.query_format or "none"

    def layer_skips(self, layers: ModelLayers) -> LayerSkips:
        """The layers this spec keeps unquantized on the model `layers` describes (quant.kv.skip_layers)."""
        return resolve_skip_layers(self.skip_layers, self.format, layers, formatted=self.layer_formats)

    def layer_format(self, layer: int, skips: LayerSkips | None = None) -> str:
        """Format name of `layer`'s main (old-token) storage: "none" for skipped layers (`skips`: resolved for
        the model; without it, skip_layers must be indices only and the format add no boundary layers)."""
        if skips is None and needs_model(self.skip_layers, self.format):
            raise QuantError("kv cache spec: skip_layers names an attention type or the format adds TurboQuant's "
                             "boundary layers: resolve them against the model (KVQuantSpec.layer_skips)")
        if layer in (skips.skipped if skips is not None else skip_indices(self.skip_layers)):
            return "none"
        return self.layer_formats.get(layer, self.format)


def kv_spec_from_dict(data: dict[str, Any]) -> KVQuantSpec:
    """Validate a plain dict (TOML table, CLI options, fault preset) into a KVQuantSpec; else QuantError."""
    try:
        return KVQuantSpec.model_validate(data)
    except ValidationError as exc:
        err = first_error(exc)
        where = err.where_or("kv cache spec")
        if err.type == "extra_forbidden":
            raise QuantError(f"kv cache spec: {unknown_key_message(where)}") from None
        if not err.where:  # the spec's own consistency rules (model validators): the message says where
            raise QuantError(f"kv cache spec: {err.msg}") from None
        raise QuantError(f"kv cache spec: {where}: {err.msg}") from None


def kv_spec_to_json(spec: KVQuantSpec) -> dict[str, JsonValue]:
    """The spec as JSON data, every field written out (its dump: a model folder as static + scales_file); what
    resolved.json and the QA_VLLM_KV variable carry, read back by `kv_spec_from_json`."""
    return spec.model_dump(mode="json")


def kv_spec_from_json(data: JsonValue) -> KVQuantSpec:
    """The spec `kv_spec_to_json` wrote (or any JSON object of the kv table's keys); QuantError otherwise."""
    if not isinstance(data, dict):
        raise QuantError(f"kv cache spec: a JSON object of the kv table's keys, got {type(data).__name__}")
    return kv_spec_from_dict(data)


def unknown_key_message(where: str) -> str:
    """"unknown key ..." with a did-you-mean for a dotted path into the kv table (e.g. prefix_cache.block)."""
    head, _, rest = where.partition(".")
    if head == "prefix_cache" and rest:
        return f"unknown key {where!r}; {did_you_mean(rest, PrefixCacheSpec.model_fields)}"
    return f"unknown key {where!r}; {did_you_mean(where, KVQuantSpec.model_fields)}"
