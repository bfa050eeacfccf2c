"""The `openai` engine next to lm-eval's `local-completions` model on the same vLLM-CPU server and items.

One vLLM-CPU api_server (evals.servers, 127.0.0.1, SmolLM2-135M-Instruct, greedy) serves both
clients. The same gsm8k generation requests (a seeded subset, the task's own prompts, stop strings
and max_tokens) go through this toolkit's `openai` engine (`/v1/completions`, `concurrency` requests
in flight) and through lm_eval.models.openai_completions.LocalCompletionsAPI (`num_concurrent` the
same, untokenised string prompts as our engine sends them). The two are timed alternately, `--rounds`
times each, after one warm-up request each; the outputs are compared item by item in every round
(lm-eval adds the EOS text to the stop list, which the server stops at anyway), and each client's
rounds with its own first round (a CPU server's batch composition can flip a greedy token: that is
the floor any agreement between clients is read against). Printed: each client's median wall time
and every round's, and the ratio ours / lm-eval's (target: <= 1, "no slower").

Usage: python -m benchmarks.openai_vs_lmeval [--model smollm2-135m] [--data-dir DIR] [--items 8]
       [--max-tokens 64] [--num-fewshot 5] [--concurrency 4] [--rounds 3] [--dtype float32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evals.data import resolve_data_dir
from evals.engines import build_engine
from evals.engines.base import GenerateRequest, GenerateResult
from evals.models.resolve import resolve_model
from evals.run.selection import select_items
from evals.servers.spec import VllmServerSpec
from evals.servers.start import start_server
from evals.tasks import get_task
from evals.tasks.base import TaskOptions

SERVER_ARGS = {  # vLLM-CPU: a 1 GiB KV cache (else 92% of RAM), no CUDA graphs, one process
    "max_model_len": 2048, "max_num_seqs": 8, "enforce_eager": True,
    "kv_cache_memory_bytes": 1 << 30, "distributed_executor_backend": "uni",
}


def agreement(a: Sequence[str], b: Sequence[str]) -> int:
    """How many outputs two runs share, position by position."""
    return sum(x == y for x, y in zip(a, b))


def lmeval_client(base_url: str, served: str, tokenizer: str, concurrency: int, max_tokens: int) -> Any:
    """lm-eval's local-completions model pointed at the server, string prompts, `concurrency` in flight."""
    from lm_eval.models.openai_completions import LocalCompletionsAPI  # lm_eval: heavy, loaded when it runs

    return LocalCompletionsAPI(base_url=f"{base_url}/completions", model=served, tokenizer_backend="huggingface",
                               tokenizer=tokenizer, tokenized_requests=False, num_concurrent=concurrency,
                               max_gen_toks=max_tokens, max_retries=3, timeout=300)


def lmeval_generate(lm: Any, requests: Sequence[GenerateRequest]) -> list[str]:
    """The requests through lm-eval's generate_until (greedy, the task's stop strings and max_tokens)."""
    from lm_eval.api.instance import Instance  # lm_eval: heavy, as above

    inst = [Instance("generate_until", {}, (r.prompt, {"until": list(r.until), "max_gen_toks": r.max_tokens,
                                                      "do_sample": False, "temperature": 0.0}), i)
            for i, r in enumerate(requests)]
    return list(lm.generate_until(inst, disable_tqdm=True))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Start the server, time both clients alternately, compare outputs, print and return the numbers."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-fewshot", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="float32", help="server dtype (float32: batch-order noise is smallest)")
    ap.add_argument("--json", default=None)
    ns = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    model = resolve_model(ns.model)
    assert model.path is not None, "a local model folder is needed to serve"
    task = get_task("gsm8k", TaskOptions(num_fewshot=ns.num_fewshot, max_tokens=ns.max_tokens))
    items = select_items(task.items(resolve_data_dir(ns.data_dir)), ns.items, seed=0)
    requests = [task.request(it, repeat=0, seed=0) for it in items]
    assert all(isinstance(r, GenerateRequest) for r in requests)
    spec = VllmServerSpec(model=model.path, served_model_name="smollm2", args={"dtype": ns.dtype, **SERVER_ARGS})
    with tempfile.TemporaryDirectory() as tmp, \
            start_server(spec, log_path=Path(tmp) / "vllm.log", ready_timeout_s=600) as server:
        ours = build_engine("openai", model, {"base_url": server.base_url, "concurrency": ns.concurrency,
                                               "served_model": "smollm2", "timeout_s": 300})
        lm = lmeval_client(server.base_url, "smollm2", str(model.path), ns.concurrency, ns.max_tokens)
        try:
            ours.generate(requests[:1])  # warm-up: connections, the server's first batch
            lmeval_generate(lm, requests[:1])
            t_ours: list[float] = []
            t_lm: list[float] = []
            outs_ours: list[list[str]] = []
            outs_lm: list[list[str]] = []
            for _ in range(ns.rounds):
                start = time.perf_counter()
                got = ours.generate(requests)
                t_ours.append(time.perf_counter() - start)
                outs_ours.append([r.text if isinstance(r, GenerateResult) else f"<failure: {r.error}>" for r in got])
                start = time.perf_counter()
                outs_lm.append(lmeval_generate(lm, requests))
                t_lm.append(time.perf_counter() - start)
        finally:
            ours.close()
    n = len(requests)
    tokens = sum(r.output_tokens for r in got if isinstance(r, GenerateResult))
    result = {
        "items": n, "max_tokens": ns.max_tokens, "concurrency": ns.concurrency, "rounds": ns.rounds,
        "dtype": ns.dtype, "ours_s": statistics.median(t_ours), "lmeval_s": statistics.median(t_lm),
        "ours_all_s": t_ours, "lmeval_all_s": t_lm, "output_tokens_last_round": tokens,
        "identical_outputs_per_round": [agreement(a, b) for a, b in zip(outs_ours, outs_lm)],
        "ours_round_to_round": [agreement(outs_ours[0], o) for o in outs_ours[1:]],
        "lmeval_round_to_round": [agreement(outs_lm[0], o) for o in outs_lm[1:]],
    }
    result["ratio_ours_over_lmeval"] = result["ours_s"] / result["lmeval_s"]
    print(f"gsm8k generate, {len(requests)} items x {ns.max_tokens} max tokens, concurrency {ns.concurrency}, "
          f"one vLLM-CPU server, median of {ns.rounds} alternating rounds")
    print(f"  openai engine:          {result['ours_s']:.2f} s (rounds {', '.join(f'{t:.1f}' for t in t_ours)})")
    print(f"  lm-eval local-completions: {result['lmeval_s']:.2f} s (rounds {', '.join(f'{t:.1f}' for t in t_lm)})")
    print(f"  ratio ours / lm-eval:   {result['ratio_ours_over_lmeval']:.3f}")
    print(f"  identical outputs:      {result['identical_outputs_per_round']} of {n} per round "
          f"(ours vs ours round 1: {result['ours_round_to_round']}, lm-eval vs lm-eval round 1: "
          f"{result['lmeval_round_to_round']})")
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
