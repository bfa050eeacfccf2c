"""The `hf` engine: a transformers causal LM on CPU or GPU, with the emulated (quantized) KV cache.

Tokenisation follows lm-eval's HFLM (lm_eval/models/huggingface.py, api/model.py `_encode_pair`),
so per-item scores match lm-eval's hf model: a log-likelihood pair is encoded as context +
continuation together and split at the context's length (trailing context spaces move to the
continuation); generation left-pads, left-truncates the prompt to `max_length - max_tokens`, and
cuts the decoded text at the first stop string.

Modules: args (HFEngineArgs, parse_args: no torch), fit (whether a kv spec fits the model, from its config:
no torch), tokens (lm-eval tokenisation), surgery (what is read off the model), model (caches and forward
passes), request_batches (requests into forward batches), shared_prefix (the shared few-shot KV),
prefix_cache (a served prompt's KV reused by later prompts) with replay (bounded replay on sliding-window
models) and cached (the requests served through it), sequence (pick, stop, result), decode (continuous
batching + draft tokens; lookup: the drafts), fixed_batch (fixed-batch fallback), score (log-likelihood),
logprobs (teacher-forced log-probs), engine (HFEngine). This package's `build` makes the engine; importing
the package loads neither torch nor transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from evals.engines.hf.args import HFEngineArgs
from evals.errors import EngineError
from evals.models.load import load_model
from evals.models.resolve import ResolvedModel
from quant.errors import QuantError

if TYPE_CHECKING:
    from evals.engines.hf.engine import HFEngine
    from quant.scales.files import KVScales


def read_scales(args: HFEngineArgs) -> KVScales | None:
    """The static KV scales the arguments name, `scales` or else the kv spec's `scales_file` (a file pair or
    a model folder), read once per engine; None when they name none; EngineError if unusable."""
    path = args.scales_source
    if path is None:
        return None
    from quant.scales.files import KVScales  # torch: the scales are tensors

    kv = args.kv  # never None here: scales need a kv spec (HFEngineArgs' validator)
    try:  # a model folder is resolved for the spec's format (quant.scales.folder.resolve_folder_scales)
        return KVScales.load(path, kv_format=kv.format if kv else None, take_as_is=bool(kv and kv.scales_as_is))
    except QuantError as exc:
        raise EngineError(f"hf engine: {exc}") from None


def check_args(args: HFEngineArgs, *, load_scales: bool = True) -> None:
    """Check what parsing cannot, without loading a model: that the scales file (if any) reads."""
    if load_scales:
        read_scales(args)


def build(model: ResolvedModel, args: HFEngineArgs) -> HFEngine:
    """Load `model` with transformers and wrap it as the `hf` engine."""
    import torch  # torch: only when the engine is built

    from evals.engines.hf.engine import HFEngine  # torch: the engine is torch code

    scales = read_scales(args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise EngineError(f"hf engine: device {args.device!r} requested but CUDA is not available; use device = 'cpu'")
    hf_model, tokenizer = load_model(model, dtype=args.dtype, device=args.device,
                                     trust_remote_code=args.trust_remote_code)
    if args.kv is not None:
        from quant.kv.attention import profile_attention  # torch: the emulated attention is torch code

        attention = profile_attention(args.kv)  # an engine profile that also rounds Q or flushes small products
        if attention is not None:
            hf_model.set_attn_implementation(attention)
    engine = HFEngine(hf_model, tokenizer, args, model.name, scales=scales)
    if args.kv is not None:
        try:  # fail at build time, not on the first sample, when the spec does not fit the model
            engine.hf.new_cache()
        except QuantError as exc:
            raise EngineError(f"hf engine: {exc}") from None
    return engine
