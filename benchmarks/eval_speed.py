"""The hf engine next to lm-eval's own hf model (HFLM) on the same items, the emulated-NVFP4 arm
next to the plain arm, and generation throughput next to transformers' generate and vLLM-CPU.

Sections (choose with --sections; all by default):
- arc_easy (loglikelihood, 200 seeded items) and gsm8k (generate, 50 items, 5-shot): the same
  requests through this toolkit's hf engine and through lm_eval.models.huggingface.HFLM wrapping
  the same model object (same batch size, same threads), timed side by side; per-item outcomes
  (every score of the task's scorer) must be identical under greedy decoding. The ratio printed
  is ours / lm-eval's wall time (targets: <= 1/3 on gsm8k, <= 1 on arc_easy).
- math500 (generate, shared 4-shot Minerva prefix): the case prefix reuse is built for; lm-eval's
  gsm8k draws 5 different shots per item, so it has no shared prefix to reuse.
- chat: gsm8k_cot_llama with the model's chat template and multi-turn shots (lm-eval's
  --apply_chat_template --fewshot_as_multiturn), --chat-items items, --chat-max-tokens new tokens:
  the same rendered prompts (checked: HFLM.apply_chat_template renders every item's messages to the
  very prompt the hf engine runs) through both engines, timed side by side, outcomes compared.
- nvfp4: the emulated NVFP4 KV-cache arm's wall time over the plain arm's on the same requests,
  the two timed alternately (target <= 1.15); for generation tasks at natural length and at a forced
  output length, since the quantized cache changes how many tokens an item generates. The candidate
  is windowless dynamic NVFP4 unless --nvfp4-kv gives another spec (a recent window turns the hf
  engine's draft tokens off for that arm only); --nvfp4-tasks picks the tasks.
- throughput: 32 prompts x 128 new tokens (greedy): hf engine tok/s, transformers `generate` on the
  same padded batch, and vLLM-CPU when the `vllm` extra is installed (the issue reports ~165 tok/s
  for vLLM-CPU and ~13 for plain transformers generate on its machine; goal: within 2x of vLLM).

Usage: python -m benchmarks.eval_speed [--model smollm2-135m] [--data-dir DIR] [--threads N]
       [--batch-size 16] [--arc-items 200] [--gsm8k-items 50] [--math-items 16] [--chat-items 16]
       [--chat-max-tokens 128] [--sections ...]
       [--nvfp4-kv JSON] [--nvfp4-tasks arc_easy,gsm8k,math500] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from evals.data import resolve_data_dir
from evals.engines.base import GenerateRequest, GenerateResult, LoglikelihoodRequest, LoglikelihoodResult
from evals.engines.hf import build
from evals.engines.hf.args import parse_args
from evals.engines.hf.engine import HFEngine
from evals.errors import EvalError
from evals.models.resolve import ResolvedModel, resolve_model
from evals.run.selection import select_items
from evals.servers.interpreter import vllm_python
from evals.tasks import get_task
from evals.tasks.base import Task, TaskOptions

SECTIONS = ("arc_easy", "gsm8k", "math500", "chat", "nvfp4", "throughput")
ISSUE_VLLM_CPU_TOK_S = 165.0  # reported in the issue for vLLM-CPU, 32 prompts x 128 tokens (not measured here)
THROUGHPUT_PROMPTS = (
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how a steam engine works, step by step.",
    "Describe a walk through a busy market in a coastal town.",
    "Write a letter to a friend about your summer holidays in the mountains.",
)


@dataclass
class Row:
    """One line of the report."""

    section: str
    what: str
    value: str
    detail: dict[str, Any] = field(default_factory=dict)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(fn(), wall seconds)."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def make_lmeval(engine: HFEngine, batch_size: int):  # -> HFLM
    """lm-eval's HF model around the very same model and tokenizer objects."""
    from lm_eval.models.huggingface import HFLM  # lm_eval: heavy, only the sections next to lm-eval load it

    return HFLM(pretrained=engine.model, tokenizer=engine.tokenizer, batch_size=batch_size, device=str(engine.device),
                max_length=engine.max_length)


def lmeval_loglikelihood(lm: Any, requests: Sequence[LoglikelihoodRequest]) -> list[LoglikelihoodResult]:
    """Our requests as lm-eval Instances (one per continuation), answers regrouped per request."""
    from lm_eval.api.instance import Instance  # lm_eval: heavy, as above

    flat = [Instance("loglikelihood", {}, (r.context, c), i) for r in requests for i, c in enumerate(r.continuations)]
    answers = iter(lm.loglikelihood(flat, disable_tqdm=True))
    out = []
    for r in requests:
        pairs = [next(answers) for _ in r.continuations]
        out.append(LoglikelihoodResult(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)))
    return out


def lmeval_generate(lm: Any, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
    """Our greedy requests through HFLM.generate_until (token counts are not reported by lm-eval)."""
    from lm_eval.api.instance import Instance  # lm_eval: heavy, as above

    inst = [Instance("generate_until", {}, (r.prompt, {"until": list(r.until), "max_gen_toks": r.max_tokens,
                                                      "do_sample": False, "temperature": 0.0}), 0) for r in requests]
    return [GenerateResult(text=t, output_tokens=-1, finish_reason="stop") for t in lm.generate_until(inst, disable_tqdm=True)]


def task_requests(task: Task, n: int, data_dir: Any) -> tuple[list[Any], list[Any]]:
    """(items, greedy requests) of a seeded subset of n items (seed 0, as `qa eval --limit n`)."""
    items = select_items(task.items(data_dir), n, seed=0)
    return items, [task.request(it, repeat=0, seed=0) for it in items]


def run_engine(engine: HFEngine, requests: Sequence[Any]) -> list[Any]:
    """Our engine on one request list (generate or loglikelihood by request type)."""
    if isinstance(requests[0], GenerateRequest):
        return engine.generate(list(requests))
    return engine.loglikelihood(list(requests))


def warm_up(engine: HFEngine, lm: Any, requests: Sequence[Any]) -> None:
    """Two requests through each engine before timing, so that first-call costs (kernel selection,
    allocator growth) are charged to neither side."""
    few = [replace(r, max_tokens=min(r.max_tokens, 4)) if isinstance(r, GenerateRequest) else r
           for r in requests[:2]]
    run_engine(engine, few)
    if lm is not None:
        (lmeval_generate if isinstance(few[0], GenerateRequest) else lmeval_loglikelihood)(lm, few)


def same_chat_prompts(lm: Any, requests: Sequence[GenerateRequest]) -> int:
    """How many chat requests lm-eval's HFLM.apply_chat_template renders to exactly the prompt we run."""
    return sum(lm.apply_chat_template([{"role": m.role, "content": m.content} for m in r.messages],
                                      add_generation_prompt=True) == r.prompt for r in requests)


def compare_task(name: str, engine: HFEngine, lm: Any, n: int, data_dir: Any, options: TaskOptions,
                 rows: list[Row], model: str | None = None, section: str | None = None) -> None:
    """Time our engine and HFLM on the same items; count per-item outcome differences."""
    task = get_task(name, options, model)
    items, requests = task_requests(task, n, data_dir)
    section = section or name
    if options.chat:
        same = same_chat_prompts(lm, requests)
        rows.append(Row(section, f"{name}: lm-eval's apply_chat_template renders our prompt", f"{same}/{len(requests)}"))
    warm_up(engine, lm, requests)
    ours, t_ours = timed(lambda: run_engine(engine, requests))
    if isinstance(requests[0], GenerateRequest):
        theirs, t_lm = timed(lambda: lmeval_generate(lm, requests))
    else:
        theirs, t_lm = timed(lambda: lmeval_loglikelihood(lm, requests))
    differ = [it.item_id for it, a, b in zip(items, ours, theirs, strict=True)
              if task.score(it, a).scores != task.score(it, b).scores]
    same_text = None
    if isinstance(requests[0], GenerateRequest):
        same_text = sum(a.text == b.text for a, b in zip(ours, theirs, strict=True))
    score_keys = sorted(task.score(items[0], ours[0]).scores)
    means = {k: sum(task.score(it, r).scores[k] or 0.0 for it, r in zip(items, ours, strict=True)) / len(items)
             for k in score_keys}
    rows.append(Row(section, f"{len(items)} items: hf engine {t_ours:.1f}s, lm-eval HFLM {t_lm:.1f}s",
                    f"ratio {t_ours / t_lm:.3f}",
                    {"items": len(items), "ours_s": t_ours, "lmeval_s": t_lm, "ratio": t_ours / t_lm,
                     "outcome_differences": differ, "identical_texts": same_text, "scores": means}))
    rows.append(Row(section, "per-item outcomes identical (greedy)",
                    "yes" if not differ else f"NO: {len(differ)} differ ({', '.join(differ[:5])})"))
    if same_text is not None:
        rows.append(Row(section, "identical completions", f"{same_text}/{len(items)}"))


def alternate(engines: Sequence[HFEngine], requests: Sequence[Any], rounds: int) -> list[tuple[list[Any], list[float]]]:
    """Run the same requests through each engine in turn, `rounds` times (A B A B ...): (last results,
    wall times) per engine. Alternating keeps drifts in machine speed from landing on one side."""
    out: list[tuple[list[Any], list[float]]] = [([], []) for _ in engines]
    for _ in range(rounds):
        for k, eng in enumerate(engines):
            res, t = timed(lambda eng=eng: run_engine(eng, requests))
            out[k] = (res, out[k][1] + [t])
    return out


def nvfp4_ratio(model: ResolvedModel, args: argparse.Namespace, data_dir: Any, plain: HFEngine,
                rows: list[Row]) -> None:
    """The emulated NVFP4 arm next to the plain arm on the same requests, timed alternately (median of
    --nvfp4-rounds runs each).

    Scoring (arc_easy, --arc-items): wall-time ratio. Generation (gsm8k, math500; --forced-items
    prompts): the NVFP4 cache changes the text, hence how many tokens each item generates, so the
    natural-length ratio mixes cost with output length; the cost ratio is measured at a forced length
    (--forced-tokens new tokens, stop strings and EOS off)."""
    engine = build(model, parse_args({"batch_size": args.batch_size, "kv": json.loads(args.nvfp4_kv)}))
    pair = (plain, engine)
    for name, n, opts in (("arc_easy", args.arc_items, TaskOptions()), ("gsm8k", args.forced_items, TaskOptions()),
                          ("math500", args.forced_items, TaskOptions(max_tokens=args.math_max_tokens))):
        if name not in args.nvfp4_tasks.split(","):
            continue
        _, requests = task_requests(get_task(name, opts), n, data_dir)
        for eng in pair:
            warm_up(eng, None, requests)
        runs: list[tuple[str, Sequence[Any], int]] = [("", requests, args.nvfp4_rounds)]
        if isinstance(requests[0], GenerateRequest):
            forced = [replace(r, until=(), max_tokens=args.forced_tokens) for r in requests]
            runs = [(" (natural length)", requests, 1), (f" ({args.forced_tokens} forced tokens)", forced, args.nvfp4_rounds)]
        for label, reqs, rounds in runs:
            forcing = label.endswith("forced tokens)")
            saved = [eng.eos_ids for eng in pair]
            if forcing:
                for eng in pair:
                    eng.eos_ids = frozenset()
            try:
                (res_p, t_p), (res_q, t_q) = alternate(pair, reqs, rounds)
            finally:
                for eng, eos in zip(pair, saved, strict=True):
                    eng.eos_ids = eos
            mp, mq = statistics.median(t_p), statistics.median(t_q)
            detail: dict[str, Any] = {"task": name, "items": len(reqs), "plain_s": t_p, "nvfp4_s": t_q,
                                      "ratio": mq / mp, "forced": forcing}
            what = f"{name}{label}: {len(reqs)} items, nvfp4 {mq:.1f}s vs plain {mp:.1f}s"
            if isinstance(reqs[0], GenerateRequest):
                detail["tokens"] = {"plain": sum(getattr(r, "output_tokens", 0) for r in res_p),
                                    "nvfp4": sum(getattr(r, "output_tokens", 0) for r in res_q)}
                what += f" (tokens {detail['tokens']['plain']} vs {detail['tokens']['nvfp4']})"
            rows.append(Row("nvfp4", what, f"ratio {mq / mp:.3f}", detail))
            print(f"{rows[-1].section:10s} {rows[-1].what:70s} {rows[-1].value}", flush=True)
    engine.close()


def throughput(engine: HFEngine, args: argparse.Namespace, rows: list[Row]) -> None:
    """Generated tokens per second for n prompts x m new tokens (greedy), three ways."""
    prompts = [THROUGHPUT_PROMPTS[i % len(THROUGHPUT_PROMPTS)] + f" (Version {i + 1}.)" for i in range(args.gen_prompts)]
    m = args.gen_tokens
    reqs = [GenerateRequest(prompt=p, max_tokens=m) for p in prompts]
    saved = engine.args
    engine.args = saved.model_copy(update={"batch_size": args.gen_prompts})
    res, t = timed(lambda: engine.generate(reqs))
    engine.args = saved
    toks = sum(r.output_tokens for r in res)
    ours = toks / t
    rows.append(Row("throughput", f"hf engine: {toks} tokens in {t:.1f}s (batch {args.gen_prompts})",
                    f"{ours:.1f} tok/s", {"tokens": toks, "seconds": t, "tok_s": ours}))

    tok = engine.tokenizer
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    with torch.inference_mode():
        out, t_hf = timed(lambda: engine.model.generate(**enc, max_new_tokens=m, do_sample=False,
                                                        pad_token_id=engine.pad_id))
    new = out[:, enc.input_ids.shape[1]:]
    hf_toks = int(sum(min(m, int((row != engine.pad_id).sum()) + 1) for row in new))
    rows.append(Row("throughput", f"transformers generate (same padded batch): {hf_toks} tokens in {t_hf:.1f}s",
                    f"{hf_toks / t_hf:.1f} tok/s", {"tokens": hf_toks, "seconds": t_hf, "tok_s": hf_toks / t_hf}))

    try:
        v_toks, t_v = _vllm_throughput(str(args.resolved.load_id), prompts, m)
    except RuntimeError as exc:
        rows.append(Row("throughput", f"vLLM-CPU: not run ({exc}); the issue reports ~{ISSUE_VLLM_CPU_TOK_S:.0f} tok/s",
                        f"hf engine / issue's vLLM = {ours / ISSUE_VLLM_CPU_TOK_S:.2f}"))
        return
    rows.append(Row("throughput", f"vLLM-CPU: {v_toks} tokens in {t_v:.1f}s", f"{v_toks / t_v:.1f} tok/s",
                    {"tokens": v_toks, "seconds": t_v, "tok_s": v_toks / t_v}))
    rows.append(Row("throughput", "hf engine / vLLM-CPU", f"{ours / (v_toks / t_v):.2f} (goal >= 0.5)"))


# Run in vLLM's own interpreter (.venv-vllm: vllm-cpu pins transformers < 5.20): argv model, max tokens,
# prompts as JSON on stdin; prints {"tokens", "seconds"} of one timed LLM.generate after a warm-up.
_VLLM_SNIPPET = """
import json, sys, time
from vllm import LLM, SamplingParams
from evals.engines.vllm.args import VllmEngineArgs, engine_kwargs
prompts, m = json.load(sys.stdin), int(sys.argv[2])
llm = LLM(model=sys.argv[1], dtype="float32", **engine_kwargs(sys.argv[1], VllmEngineArgs(), on_cpu=True))
params = SamplingParams(max_tokens=m, temperature=0.0)
llm.generate(prompts[:2], SamplingParams(max_tokens=4))
t = time.perf_counter()
outs = llm.generate(prompts, params)
seconds = time.perf_counter() - t
print("RESULT " + json.dumps({"tokens": sum(len(o.outputs[0].token_ids) for o in outs), "seconds": seconds}))
"""


def _vllm_throughput(model_dir: str, prompts: list[str], max_tokens: int) -> tuple[int, float]:
    """(generated tokens, seconds) of vLLM-CPU's offline engine on `prompts` (greedy), timed in its own
    interpreter (the vllm venv when vllm is not importable here). RuntimeError when it cannot run."""
    try:
        python = vllm_python()
    except EvalError as exc:
        raise RuntimeError(str(exc)) from None
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([python, "-c", _VLLM_SNIPPET, model_dir, str(max_tokens)], input=json.dumps(prompts),
                          capture_output=True, text=True, cwd=root, timeout=1800, check=False,
                          env={**os.environ, "PYTHONPATH": str(root)})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"vLLM exited {proc.returncode}: {tail}")
    result = json.loads(lines[-1].removeprefix("RESULT "))
    return int(result["tokens"]), float(result["seconds"])


def main(argv: Sequence[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--arc-items", type=int, default=200)
    parser.add_argument("--gsm8k-items", type=int, default=50)
    parser.add_argument("--math-items", type=int, default=16)
    parser.add_argument("--math-max-tokens", type=int, default=128)
    parser.add_argument("--chat-items", type=int, default=16, help="chat section: gsm8k_cot_llama items")
    parser.add_argument("--chat-max-tokens", type=int, default=128, help="chat section: new tokens per item")
    parser.add_argument("--gen-prompts", type=int, default=32)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--forced-items", type=int, default=16, help="nvfp4 section: generation prompts per task")
    parser.add_argument("--nvfp4-rounds", type=int, default=2, help="nvfp4 section: alternating runs per arm")
    parser.add_argument("--forced-tokens", type=int, default=64, help="nvfp4 section: tokens per forced prompt")
    parser.add_argument("--nvfp4-kv", default='{"format": "nvfp4"}',
                        help="nvfp4 section: the candidate's kv spec as JSON (e.g. with a recent_window)")
    parser.add_argument("--nvfp4-tasks", default="arc_easy,gsm8k,math500", help="nvfp4 section: tasks to time")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {SECTIONS}")
    data_dir = resolve_data_dir(args.data_dir)
    args.resolved = resolve_model(args.model)
    engine = build(args.resolved, parse_args({"batch_size": args.batch_size}))
    rows: list[Row] = [Row("setup", "machine", f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, "
                                               f"batch size {args.batch_size}, model {args.model}")]
    lm = make_lmeval(engine, args.batch_size) if {"arc_easy", "gsm8k", "math500", "chat"} & set(sections) else None
    for name, n, opts in (("arc_easy", args.arc_items, TaskOptions()),
                          ("gsm8k", args.gsm8k_items, TaskOptions()),
                          ("math500", args.math_items, TaskOptions(max_tokens=args.math_max_tokens))):
        if name in sections:
            compare_task(name, engine, lm, n, data_dir, opts, rows)
            print(*(f"{r.section:10s} {r.what:70s} {r.value}" for r in rows[-3:]), sep="\n", flush=True)
    if "chat" in sections:
        chat = TaskOptions(chat=True, fewshot_as_multiturn=True, max_tokens=args.chat_max_tokens)
        compare_task("gsm8k_cot_llama", engine, lm, args.chat_items, data_dir, chat, rows, args.model, "chat")
        print(*(f"{r.section:10s} {r.what:70s} {r.value}" for r in rows[-4:]), sep="\n", flush=True)
    if "nvfp4" in sections:
        nvfp4_ratio(args.resolved, args, data_dir, engine, rows)
    if "throughput" in sections:
        throughput(engine, args, rows)
    print("\n" + "=" * 110)
    for r in rows:
        print(f"{r.section:10s} {r.what:76s} {r.value}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([r.__dict__ for r in rows], fh, indent=2, default=str)
    return rows


if __name__ == "__main__":
    main()
