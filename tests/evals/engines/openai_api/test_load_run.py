"""An `openai` arm under `load` against the scripted server: the evaluated requests go out amid fillers (what
the server saw in flight, from its own log), answers stay in order, what ran is recorded (the client's count,
the server's /metrics where it is vLLM, what was not recorded elsewhere), and a filler the server refuses
refuses the call in one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evals.engines import base, parse_engine_args
from evals.engines.openai_api import load_metrics
from evals.engines.openai_api.args import OpenAIArgs
from evals.engines.openai_api.completions import OpenAIEngine
from evals.engines.openai_api.load_metrics import metric_samples
from evals.errors import EngineError
from tests.evals.engines.openai_api.fake_server import NO_MODEL, CharTokenizer, FakeServer


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Iterator[FakeServer]:
    server = FakeServer(tmp_path, mode="vllm")
    server.start()
    yield server
    server.stop()


def loaded_engine(url: str, load: dict, **extra: object) -> OpenAIEngine:
    args = parse_engine_args("openai", {"base_url": url, "max_retries": 1, "backoff_base_s": 0.05,
                                        "timeout_s": 5.0, "load": load, **extra})
    assert isinstance(args, OpenAIArgs)
    return OpenAIEngine(NO_MODEL, args, tokenizer=CharTokenizer())


def _requests(n: int) -> list[base.GenerateRequest]:
    return [base.GenerateRequest(prompt=f"item {i} " + "x" * (10 * i), until=("STOP",), max_tokens=4)
            for i in range(n)]


def test_evaluated_requests_go_out_amid_fillers(fake_vllm: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load_metrics, "SAMPLE_INTERVAL_S", 0.01)
    engine = loaded_engine(fake_vllm.base_url, {"concurrency": 4, "evaluated_slots": 1, "filler_max_tokens": 5})
    requests = _requests(8)
    try:
        results = engine.generate(requests)
    finally:
        engine.close()
    assert [r.text for r in results] == [" out:" + r.prompt[::-1] + " " for r in requests]  # in order
    seen = fake_vllm.requests()
    evaluated = [s for s in seen if "ignore_eos" not in s["body"]]
    fillers = [s for s in seen if s["body"].get("ignore_eos")]
    prompts = {r.prompt for r in requests}
    assert len(evaluated) == 8 and all(f["prompt"] in prompts and f["body"]["max_tokens"] == 5 for f in fillers)
    # the server's own count of the POSTs it was answering as each evaluated one arrived (itself included)
    arrivals = [s["inflight"] for s in evaluated[1:]]
    print(f"server in flight at the evaluated arrivals: {arrivals}")
    assert max(s["inflight"] for s in seen) == 4 and sum(a == 4 for a in arrivals) >= len(arrivals) // 2
    rec = engine.load_record
    assert rec is not None and rec.server == "vllm" and rec.filler_ignore_eos
    print(rec.model_dump())
    assert rec.evaluated_requests == 8 and rec.filler_requests == len(fillers) >= 3  # every filler slot sent
    assert (rec.concurrency, rec.evaluated_slots, rec.filler_max_tokens) == (4, 1, 5)
    # three fillers beside each evaluated request (the client's count: fillers from when they are set out)
    assert 2 < rec.companions_min <= rec.companions_mean <= 3 and rec.companions_mean > 2.5
    # the fake's /metrics: its POSTs in flight as vLLM's running gauge, its cache as vLLM's cache_config_info
    assert rec.samples > 0 and rec.max_running is not None and 2 <= rec.max_running <= 4
    assert rec.preemptions == 0 and (rec.kv_cache_blocks, rec.block_size) == (64, 16)
    assert rec.unrecorded == []


def test_concurrency_one_sends_nothing_beside(fake_vllm: FakeServer) -> None:
    engine = loaded_engine(fake_vllm.base_url, {"concurrency": 1})
    try:
        engine.generate(_requests(3))
    finally:
        engine.close()
    rec = engine.load_record
    assert rec is not None and rec.filler_requests == 0 and rec.companions_min == rec.companions_mean == 0
    assert max(s["inflight"] for s in fake_vllm.requests()) == 1


def test_scored_requests_get_token_id_fillers(fake_vllm: FakeServer) -> None:
    engine = loaded_engine(fake_vllm.base_url, {"concurrency": 3, "evaluated_slots": 1, "filler_max_tokens": 2},
                           echo=True)
    reqs = [base.LoglikelihoodRequest(context=f"ctx {i}", continuations=(" a", " b")) for i in range(4)]
    try:
        got = engine.loglikelihood(reqs)
    finally:
        engine.close()
    assert all(isinstance(g, base.LoglikelihoodResult) for g in got)
    fillers = [s for s in fake_vllm.requests() if s["body"].get("ignore_eos")]
    assert fillers and all(len(f["prompt"]) == 1 and isinstance(f["prompt"][0][0], int) for f in fillers)


def test_a_server_of_another_kind_says_what_was_not_recorded(fake) -> None:
    engine = loaded_engine(fake.base_url, {"concurrency": 3, "filler_max_tokens": 2})
    try:
        engine.generate(_requests(3))
    finally:
        engine.close()
    rec = engine.load_record
    assert rec is not None and rec.server == "openai" and not rec.filler_ignore_eos
    assert rec.samples == 0 and rec.max_running is None and rec.preemptions is None
    assert any("ignore_eos" in u for u in rec.unrecorded)
    assert any("/metrics is not read" in u for u in rec.unrecorded)
    assert not any("ignore_eos" in s["body"] for s in fake.requests())


def test_a_refused_filler_refuses_the_call_in_one_line(fake_vllm: FakeServer) -> None:
    engine = loaded_engine(fake_vllm.base_url, {"concurrency": 2, "filler_max_tokens": 2})
    try:
        with pytest.raises(EngineError, match=r"^load: a filler request failed \(HTTP 400") as err:
            engine.generate([base.GenerateRequest(prompt="BAD one", until=(), max_tokens=2)])
    finally:
        engine.close()
    assert "\n" not in str(err.value)


def test_metric_samples_reads_labels_and_values() -> None:
    text = ('# HELP x\nvllm:num_requests_running{engine="0"} 3.0\nvllm:num_requests_running{engine="1"} 1.0\n'
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="96"} 1.0\n')
    got = metric_samples(text)
    assert [v for _, v in got["vllm:num_requests_running"]] == [3.0, 1.0]
    assert got["vllm:cache_config_info"][0][0] == {"block_size": "16", "num_gpu_blocks": "96"}
