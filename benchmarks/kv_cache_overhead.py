"""Wall-time overhead of the emulated quantized KV cache vs the plain model.

The plain side uses the hf engine's baseline cache (`quant.kv.plain`, growable buffers like the
emulated cache's) by default, or transformers' DynamicCache with `--plain dynamic`.

Greedy generation of exactly --new-tokens tokens after a --prompt-tokens prompt (random token ids from a
seeded generator: the content does not change the cost), plain and emulated runs interleaved so that
machine load drifts affect both; reports the median of --repeats runs each (wall and process CPU
time) and the overhead ratio - 1.

    python -m benchmarks.kv_cache_overhead --format nvfp4 --prompt-tokens 512 --new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from evals.models.load import load_model
from evals.models.resolve import resolve_model
from quant.kv.cache import make_cache
from quant.kv.plain import make_plain_cache
from quant.kv.spec import kv_spec_from_dict


def _generate(model, ids: torch.Tensor, new_tokens: int, cache) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one greedy generation."""
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            cache=cache,
        )
    elapsed = time.perf_counter() - start, time.process_time() - cpu
    assert out.shape[1] == ids.shape[1] + new_tokens
    return elapsed


def main() -> None:
    """Parse options, time plain vs emulated generation, print a JSON summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--format", default="nvfp4")
    p.add_argument("--recent-window", type=int, default=0)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--plain", choices=("growable", "dynamic"), default="growable",
                   help="plain-side cache: the engine's baseline cache or transformers' DynamicCache")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(resolve_model(args.model), dtype=args.dtype, device=args.device)
    model.generation_config.eos_token_id = None  # always generate exactly new_tokens
    spec = kv_spec_from_dict({"format": args.format, "recent_window": args.recent_window})
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, tokenizer.vocab_size, (1, args.prompt_tokens), generator=gen).to(args.device)
    _generate(model, ids, 4, None)  # warm-up
    plain, emulated = [], []
    for _ in range(args.repeats):
        plain.append(_generate(model, ids, args.new_tokens,
                               make_plain_cache(model.config) if args.plain == "growable" else None))
        emulated.append(_generate(model, ids, args.new_tokens, make_cache(model.config, spec)))
    # process CPU time is reported too: on a shared machine it is far less noisy than wall time
    summary: dict[str, object] = {
        "model": args.model,
        "spec": spec.model_dump(mode="json", exclude_defaults=True),
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "threads": torch.get_num_threads(),
        "plain_cache": args.plain,
    }
    for i, what in enumerate(("wall", "cpu")):
        p_s, e_s = [t[i] for t in plain], [t[i] for t in emulated]
        summary[f"plain_{what}_s"], summary[f"emulated_{what}_s"] = p_s, e_s
        summary[f"overhead_{what}"] = statistics.median(e_s) / statistics.median(p_s) - 1.0
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
