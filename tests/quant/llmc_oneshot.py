"""Run in .venv-llmc (llm-compressor's own pins), never imported by the test suite: llm-compressor's `oneshot`
with a KV-cache-only `QuantizationModifier(targets=[], kv_cache_scheme=...)` on a model folder and a few text
lines, once per scheme, each saved as llm-compressor saves it (`save_pretrained(save_compressed=True)`) in
OUT_ROOT/<scheme>/, with OUT_ROOT/<scheme>.amax.json: the amax llm-compressor's default observer arrives at on
the same batches (per layer, K and V; per KV head for attn_head), so a test can check the stored numbers
against it. A scheme llm-compressor refuses leaves OUT_ROOT/<scheme>.refused: `<ExceptionType>: <message>`.

usage: python llmc_oneshot.py MODEL_DIR TEXT_FILE OUT_ROOT SCHEME [SCHEME ...] [--lines N] [--max-len T]
SCHEME: fp8 (8-bit float, tensor), fp4 (4-bit float, tensor), fp8-head (8-bit float, attn_head),
nvfp4-group (4-bit float, tensor_group of 16, static), nvfp4-local (the same, dynamic "local").

The default observer (a kv_cache_scheme without `observer`) is llm-compressor's "minmax", MinMaxObserver in
llmcompressor/observers/min_max.py: per batch the min and max (over tokens and, per tensor, all heads), then
a moving average `lerp(previous, new, 0.01)` (observer_kwargs averaging_constant); calculate_qparams then
takes max(|min|, |max|). `_observer_amax` repeats that on the model's own KV cache (post-RoPE K, as
compressed-tensors' QuantizedKVCache sees it), batches in the order oneshot runs them (no shuffling).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SCHEMES: dict[str, dict[str, object]] = {
    "fp8": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True},
    "fp4": {"num_bits": 4, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True},
    "fp8-head": {"num_bits": 8, "type": "float", "strategy": "attn_head", "dynamic": False, "symmetric": True},
    "nvfp4-group": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                    "dynamic": False, "symmetric": True},
    "nvfp4-local": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                    "dynamic": "local", "symmetric": True},
}
AVERAGING_CONSTANT = 0.01  # MinMaxObserver's default observer_kwargs["averaging_constant"]


def _lines(path: Path, n: int) -> list[str]:
    """The first `n` WikiText-2 lines with some text (headings and blank lines skipped)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if len(text) > 80 and not text.startswith("="):
            out.append(text)
        if len(out) == n:
            break
    return out


def _observer_amax(model, batches, per_head: bool) -> dict[str, list]:  # model, batches: torch objects
    """The amax MinMaxObserver ends with, per layer (K and V), from the model's own cache after each batch."""
    import torch
    from transformers import DynamicCache

    state: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
    with torch.no_grad():
        for ids in batches:
            cache = DynamicCache(config=model.config)
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            for i, layer in enumerate(cache.layers):
                for kind, x in (("k", layer.keys), ("v", layer.values)):  # [batch, heads, tokens, head_dim]
                    dims = (0, 2, 3) if per_head else (0, 1, 2, 3)
                    lo, hi = x.amin(dim=dims).double(), x.amax(dim=dims).double()
                    if (kind, i) in state:
                        plo, phi = state[(kind, i)]
                        lo = plo * (1 - AVERAGING_CONSTANT) + lo * AVERAGING_CONSTANT
                        hi = phi * (1 - AVERAGING_CONSTANT) + hi * AVERAGING_CONSTANT
                    state[(kind, i)] = (lo, hi)
    layers = model.config.num_hidden_layers
    return {kind: [torch.maximum(-state[(kind, i)][0], state[(kind, i)][1]).tolist() for i in range(layers)]
            for kind in "kv"}


def main() -> int:
    """Calibrate and save each scheme (or record its refusal)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("text", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("schemes", nargs="+", choices=sorted(SCHEMES))
    ap.add_argument("--lines", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=128)
    a = ap.parse_args()

    import torch
    from compressed_tensors.quantization import QuantizationArgs
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(a.model)
    enc = [tok(line, truncation=True, max_length=a.max_len)["input_ids"] for line in _lines(a.text, a.lines)]
    a.out.mkdir(parents=True, exist_ok=True)
    for name in a.schemes:
        scheme = SCHEMES[name]
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
        amax = _observer_amax(model, [torch.tensor([ids]) for ids in enc], scheme["strategy"] == "attn_head")
        dataset = Dataset.from_dict({"input_ids": enc, "attention_mask": [[1] * len(ids) for ids in enc]})
        try:
            recipe = QuantizationModifier(targets=[], kv_cache_scheme=QuantizationArgs(**scheme))
            oneshot(model=model, dataset=dataset, recipe=recipe, num_calibration_samples=len(enc),
                    max_seq_length=a.max_len, batch_size=1, shuffle_calibration_samples=False)
        except Exception as exc:  # noqa: BLE001 - the writer's own refusal is the result
            (a.out / f"{name}.refused").write_text(f"{type(exc).__name__}: {' '.join(str(exc).split())}\n")
            continue
        model.save_pretrained(a.out / name, save_compressed=True)
        tok.save_pretrained(a.out / name)
        (a.out / f"{name}.amax.json").write_text(json.dumps({**amax, "batches": len(enc)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
