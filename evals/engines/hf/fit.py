"""Whether an hf arm's kv spec fits its model, read from the model's config alone (no weights, no torch).

`check_model_fit` is what `qa run` (and its dry run) checks before any arm starts, so a spec the engine
would refuse at build time is one error line at the start: layer types the emulated cache does not
support (encoder-decoder, a family it cannot describe), and a prefix cache whose replay window or block
does not fit the context, or whose replay window is larger than the smallest sliding window (bounded
replay rebuilds at most one window of a sliding layer: evals.engines.hf.replay) or asks for a replay on
a model with no sliding-window layer (nothing to replay). The engine applies the
same `prefix_cache_problem` when it builds its prefix cache (evals.engines.hf.prefix_cache).
"""

from __future__ import annotations

from typing import Any

from evals.engines.hf.args import HFEngineArgs
from evals.errors import EngineError
from evals.models.resolve import ResolvedModel
from quant.errors import QuantError
from quant.kv.shape import SLIDING_LAYER_TYPES, ModelKVShape, model_kv_shape
from quant.kv.spec import PrefixCacheSpec

DEFAULT_MAX_LENGTH = 2048  # lm-eval HFLM._DEFAULT_MAX_LENGTH, used when the config names no window
WHERE = "hf engine: kv cache spec: prefix_cache"


def context_window(config: Any, tokenizer: Any) -> int:
    """The model's context window as lm-eval resolves it (config attributes, then tokenizer)."""
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    tml = getattr(tokenizer, "model_max_length", None)
    if isinstance(tml, int) and 0 < tml < 10**10:
        return tml
    return DEFAULT_MAX_LENGTH


def prefix_cache_problem(spec: PrefixCacheSpec, max_length: int, shape: ModelKVShape) -> str | None:
    """Why `spec` cannot serve a model of `shape` and context `max_length` (None: it can)."""
    if spec.replay_window >= max_length:
        return (f"{WHERE}.replay_window {spec.replay_window} is larger than the model context "
                f"({max_length} tokens); use a smaller window")
    if spec.block >= max_length:
        return f"{WHERE}.block {spec.block} is not smaller than the model context ({max_length} tokens)"
    windows = [int(w) for t, w in zip(shape.layer_types, shape.sliding_windows, strict=True)
               if t in SLIDING_LAYER_TYPES and w]
    if spec.replay_window and not windows:
        return (f"{WHERE}.replay_window {spec.replay_window} needs a model with sliding-window layers, and "
                "this one has none: bounded replay rebuilds sliding-window caches (vLLM replays only those), "
                "and on full attention it would recompute positions whose every input is cached; set "
                "replay_window = 0")
    if windows and spec.replay_window > min(windows):
        return (f"{WHERE}.replay_window {spec.replay_window} is larger than the model's sliding window "
                f"({min(windows)} positions); bounded replay rebuilds at most one window")
    return None


def check_config_fit(config: Any, args: HFEngineArgs) -> None:
    """EngineError (one line) when `args.kv` cannot run on a model with this transformers config."""
    if args.kv is None:
        return
    try:
        model_kv_shape(config, recurrent_ok=True)
        prefix = args.kv.prefix_cache
        if prefix is None or not prefix.enabled:
            return
        shape = model_kv_shape(config)  # the prefix cache keeps K/V of every layer: no recurrent state
    except QuantError as exc:
        raise EngineError(f"hf engine: {exc}") from None
    problem = prefix_cache_problem(prefix, args.max_length or context_window(config, None), shape)
    if problem is not None:
        raise EngineError(problem)


def check_model_fit(model: ResolvedModel, args: HFEngineArgs) -> None:
    """`check_config_fit` on a model folder's config.json; nothing for a hub id (the engine checks at build)."""
    if args.kv is None or model.path is None:
        return
    from transformers import AutoConfig  # transformers: only for an arm with an emulated KV cache

    config = AutoConfig.from_pretrained(str(model.path), trust_remote_code=args.trust_remote_code)
    check_config_fit(config, args)
