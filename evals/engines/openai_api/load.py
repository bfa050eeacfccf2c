"""The `load` option of an `openai` arm: its evaluated requests sent amid filler clients, as on a busy server.

`engine_args.load` is the `vllm` engine's table (evals.engines.load.LoadSpec: concurrency N, filler
"task" | "wikitext2", filler_max_tokens M, evaluated_slots K, seed); while any evaluated request of an engine
call is in flight the client keeps N requests in flight against the server: at most K evaluated ones, filler
requests in the other slots (evals.engines.openai_api.load_run). What the served arm cannot take:
`kv_cache_blocks` (the client does not size its server's KV cache: a vLLM server's own
`num_gpu_blocks_override` in its args does), `concurrency` beside `load` (K bounds the evaluated requests) and
several replicas (the load drives one server).

What ran is a ServedLoadRecord in arm.json (engine_info.load): the client's count of the requests in flight
beside each evaluated one, and for a vLLM server its own /metrics sampled while loaded calls ran. This module
builds filler prompts and holds the record; pydantic only, no httpx.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, JsonValue

from evals.engines.load import BLOCKS_FLAG, FillerSource, LoadSpec

MAX_SERVED_CONCURRENCY = 256  # one client thread per request in flight (as OpenAIArgs.concurrency)
# what a filler sends: a completions prompt (text or token ids) or chat messages
FillerPrompt = str | list[int] | list[dict[str, str]]
# the server kinds that honour `ignore_eos` in a completions / chat body (vLLM, SGLang, llama.cpp's server)
IGNORE_EOS_KINDS = frozenset({"vllm", "sglang", "llamacpp"})


def served_load_problem(load: LoadSpec, given: set[str], replicas: int) -> str | None:
    """Why `load` cannot go on this `openai` arm (`given`: the engine arguments the spec set; `replicas`:
    how many base_urls); None when it can."""
    if load.kv_cache_blocks is not None:
        return (f"load.kv_cache_blocks: an openai arm cannot size its server's KV cache; set {BLOCKS_FLAG} in the "
                "vLLM server's args (server = { kind = \"vllm\", args = { ... } }) instead")
    if load.concurrency > MAX_SERVED_CONCURRENCY:
        return (f"load.concurrency = {load.concurrency}: an openai arm holds one client thread per request in "
                f"flight, at most {MAX_SERVED_CONCURRENCY}")
    if "concurrency" in given:
        return "concurrency and load: under load, load.evaluated_slots bounds the evaluated requests; remove concurrency"
    if replicas > 1:
        return "load drives one server; base_urls lists several replicas"
    return None


def filler_path(prompt: FillerPrompt) -> str:
    """The endpoint a filler prompt goes to: chat messages to /chat/completions, the rest to /completions."""
    return "/chat/completions" if prompt and isinstance(prompt[0], dict) else "/completions"


def filler_body(prompt: FillerPrompt, max_tokens: int, kind: str) -> dict[str, JsonValue]:
    """One filler's request body (the model name is added by the client): `max_tokens` decoded greedily,
    EOS ignored where the server kind honours it."""
    if filler_path(prompt) == "/chat/completions":
        body: dict[str, JsonValue] = {"messages": prompt}  # type: ignore[dict-item]
    else:  # token ids as a batch of one prompt, as the engine's own scored requests send them
        body = {"prompt": prompt if isinstance(prompt, str) else [prompt]}  # type: ignore[dict-item]
    body.update(max_tokens=max_tokens, temperature=0.0)
    if kind in IGNORE_EOS_KINDS:
        body["ignore_eos"] = True
    return body


def _length(prompt: FillerPrompt) -> int:
    """A prompt's length: tokens of an id prompt, characters of a text prompt or of the messages' contents."""
    if isinstance(prompt, str):
        return len(prompt)
    if prompt and isinstance(prompt[0], dict):
        return sum(len(str(m.get("content", ""))) for m in prompt)  # type: ignore[union-attr]
    return len(prompt)


def _window(source: Sequence[int] | str, n: int, rng: random.Random) -> Sequence[int] | str:
    n = max(1, min(n, len(source)))
    start = rng.randrange(0, max(1, len(source) - n))
    return source[start : start + n]


def filler_prompts(prompts: Sequence[FillerPrompt], filler: FillerSource, rng: random.Random, *,
                   wikitext_text: str = "", wikitext_ids: Sequence[int] = ()) -> list[FillerPrompt]:
    """One call's filler prompts: the call's own prompts rotated by half (a filler is not the evaluated prompt
    beside it), or WikiText-2 windows of their lengths: characters of a text prompt (a chat prompt becomes one
    user message), tokens of an id prompt."""
    if filler == "task":
        half = len(prompts) // 2
        return [p for p in [*prompts[half:], *prompts[:half]] if p]
    out: list[FillerPrompt] = []
    for p in prompts:
        if isinstance(p, str) or (p and isinstance(p[0], dict)):
            text = str(_window(wikitext_text, _length(p), rng))
            out.append(text if isinstance(p, str) else [{"role": "user", "content": text}])
        else:
            out.append(list(_window(wikitext_ids, _length(p), rng)))  # type: ignore[arg-type]
    return [p for p in out if p]


class ServedLoadRecord(BaseModel):
    """What a loaded `openai` arm ran: the client's requests in flight, and a vLLM server's own /metrics sampled
    while loaded calls ran (None where the server gave none: `unrecorded` says why). Not fingerprinted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    served: Literal[True] = True  # tells this record from the offline engine's LoadRecord
    concurrency: int
    filler: FillerSource
    filler_max_tokens: int
    evaluated_slots: int
    server: str  # the server kind (vllm, sglang, llamacpp, openai)
    filler_ignore_eos: bool  # whether fillers asked the server to ignore EOS (a kind known to honour it)
    evaluated_requests: int  # HTTP requests (a log-likelihood request of several continuations is one)
    filler_requests: int
    # client side: requests in flight (set out, answer not yet read) beside an evaluated one, averaged over its
    # time in flight; the fewest of those averages and their mean over the evaluated requests
    companions_min: float
    companions_mean: float
    # the server's /metrics, read every `sample_interval_s` while a loaded call ran
    sample_interval_s: float
    samples: int
    running_samples: dict[str, int] | None  # vllm:num_requests_running -> number of readings
    max_running: int | None
    mean_running: float | None
    max_waiting: int | None  # vllm:num_requests_waiting
    preemptions: int | None  # vllm:num_preemptions_total, its growth over the loaded calls
    kv_cache_usage_max: float | None  # vllm:kv_cache_usage_perc (a fraction)
    kv_cache_usage_mean: float | None
    kv_cache_blocks: int | None  # vllm:cache_config_info's num_gpu_blocks (the server's resolved cache)
    block_size: int | None
    unrecorded: list[str]  # what could not be recorded, and why
    source: str = "client in-flight count + the server's GET /metrics (vLLM's gauges and counters)"


def record_fields(spec: LoadSpec) -> Mapping[str, object]:
    """The spec's part of a ServedLoadRecord."""
    return {"concurrency": spec.concurrency, "filler": spec.filler, "filler_max_tokens": spec.filler_max_tokens,
            "evaluated_slots": spec.slots}
