"""Loading a resolved model with transformers for inference (the hf engine, calibration, kv-inspect)."""

from __future__ import annotations

from evals.errors import ModelError, one_line
from evals.models.resolve import ResolvedModel


def load_model(resolved: ResolvedModel, *, dtype: str = "float32", device: str = "cpu",
               trust_remote_code: bool = False):  # -> tuple[PreTrainedModel, PreTrainedTokenizerBase]
    """Load model and tokenizer for inference (eval mode, no grad needed by callers)."""
    import torch  # torch: only when a model is loaded
    from transformers import AutoModelForCausalLM, AutoTokenizer  # transformers: only when a model is loaded

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    if torch_dtype is None:
        raise ModelError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved.load_id, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            resolved.load_id, dtype=torch_dtype, trust_remote_code=trust_remote_code
        )
    except Exception as exc:  # noqa: BLE001 - a broken folder (weights, tokenizer, config) is bad input
        raise ModelError(f"cannot load model {resolved.name!r}: {one_line(exc)[:400]}") from None
    model.to(device)
    model.eval()
    return model, tokenizer
