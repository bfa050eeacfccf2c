"""`qa run --dry-run`: a vLLM server's exact command line (nothing added), an offline vLLM arm's exact
LLM keywords, the arm's env with secrets redacted, offline data parallel refused; vLLM's own check
where vLLM is installed, one line saying so where it is not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evals.errors import EngineError
from evals.servers.interpreter import VLLM_PYTHON_ENV
from qa import api
from qa.files.spec import parse_spec
from qa.pipeline.dry_run import PORT_SHOWN, PlannedArm
from qa.pipeline.preflight import preflight
from qa.pipeline.resolve import resolve_run
from tests.shared_data import shared_data_dir
from tests.vllm_env import vllm_python_or_skip

ROOT = Path(__file__).resolve().parents[3]
HEAD = 'name = "dry"\nmodel = "smollm2-135m"\n[[tasks]]\nname = "gsm8k"\nlimit = 2\n'
BASELINE = '[arms.baseline]\nengine = "hf"\n'
SERVER = ('[arms.candidate]\nengine = "openai"\nenv = { VLLM_CPU_KVCACHE_SPACE = "1", HF_TOKEN = "hf_secret_x" }\n'
          'server = { kind = "vllm", args = { enable_prefix_caching = false } }\n')
OFFLINE = ('[arms.offline]\nengine = "vllm"\n'
           'engine_args = { kv_cache_dtype = "fp8", enable_prefix_caching = false, max_model_len = 2048 }\n')


def _plan(text: str) -> dict[str, PlannedArm]:
    return {a.name: a for a in api.dry_run(parse_spec(HEAD + text), data_dir=shared_data_dir()).arms}


def test_without_vllm_the_command_is_shown_and_the_check_says_so(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "no-python"))  # no vLLM anywhere
    arm = _plan(BASELINE + SERVER)["candidate"]
    assert arm.command[1:4] == ("-m", "vllm.entrypoints.openai.api_server", "--model")
    assert arm.command[-3:] == ("--port", PORT_SHOWN, "--no-enable-prefix-caching")  # nothing added
    assert not any("kv-cache-memory" in c for c in arm.command)
    assert arm.server is not None and "--no-enable-prefix-caching" in arm.server["command"]
    assert arm.env == {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": "<redacted>"}
    assert [n for n in arm.notes if "not checked: vllm is not installed" in n]
    with pytest.raises(EngineError, match="does not exist"):  # a real run refuses
        preflight(resolve_run(parse_spec(HEAD + BASELINE + SERVER), tmp_path / "run", data_dir=shared_data_dir(),
                              spec_dir=None))


def test_offline_data_parallel_is_refused_without_vllm_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "no-python"))
    spec = parse_spec(HEAD + BASELINE + '[arms.candidate]\nengine = "vllm"\nengine_args = { data_parallel_size = 2 }\n')
    with pytest.raises(EngineError, match=r"arm 'candidate': data_parallel_size = 2: .*; use a server"):
        api.dry_run(spec, data_dir=shared_data_dir())


def test_the_cli_prints_the_command_line(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(HEAD + BASELINE + SERVER)
    env = {**os.environ, VLLM_PYTHON_ENV: str(tmp_path / "no-python"), "QA_DATA_DIR": str(shared_data_dir()),
           "COLUMNS": "400"}
    out = subprocess.run([sys.executable, "-m", "qa.cli", "run", str(spec), "--dry-run"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "vllm.entrypoints.openai.api_server --model" in out.stdout
    assert "--no-enable-prefix-caching" in out.stdout and "kv-cache-memory" not in out.stdout
    assert "hf_secret_x" not in out.stdout


@pytest.mark.vllm
def test_vllm_checks_every_vllm_arm_in_one_child() -> None:
    vllm_python_or_skip()
    plan = _plan(BASELINE + SERVER + OFFLINE)
    server, offline = plan["candidate"], plan["offline"]
    assert any(n.startswith("arguments checked by vLLM 0.") for n in server.notes)
    assert any("92% of RAM" in n for n in server.notes)  # no kv_cache_memory_bytes given
    assert any(n.startswith("arguments checked by vLLM 0.") for n in offline.notes)
    assert offline.engine_args["enable_prefix_caching"] is False and offline.engine_args["kv_cache_dtype"] == "fp8"
    assert plan["baseline"].notes == ()
