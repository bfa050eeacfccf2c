"""Arms served by a local server that `qa run` starts and stops: the `server` table is validated,
and a real run against llama.cpp's server (xllamacpp) writes records, stops both servers by pid, and
resumes on a rerun although each start picks a new port."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from evals.records.samples import read_records
from qa.errors import SpecError
from qa.files.spec import parse_spec
from tests.processes import alive
from tests.shared_data import shared_data_dir
from tests.vllm_env import vllm_python_or_skip

ROOT = Path(__file__).resolve().parents[3]

HEAD = 'name = "s"\n[[tasks]]\nname = "gsm8k"\nlimit = 2\n'


def _spec(baseline: str, candidate: str = 'engine = "hf"') -> str:
    return f"{HEAD}[arms.baseline]\n{baseline}\n[arms.candidate]\n{candidate}\n"


@pytest.mark.parametrize(
    ("arm", "message"),
    [
        ('engine = "hf"\nserver = { kind = "llamacpp" }', "only an 'openai' arm"),
        ('engine = "openai"\nengine_args = { base_url = "http://127.0.0.1:1/v1" }\nserver = { kind = "llamacpp" }',
         "base_url"),
        ('engine = "openai"\nserver = { kind = "llamacpp", args = { max_model_len = 512 } }',
         "args: not a setting of a llamacpp server"),
        ('engine = "openai"\nserver = { kind = "vllm", n_ctx = 512 }', "n_ctx: not a setting of a vllm server"),
        ('engine = "openai"\nserver = { kind = "sglang" }', "server.kind"),
        ('engine = "openai"\nserver = { kind = "llamacpp", n_ctxx = 512 }', "unknown key"),
        ('engine = "openai"\nserver = { kind = "vllm", args = { port = 8000 } }', "args.port: set by `qa run`"),
        ('engine = "openai"\nserver = { kind = "vllm", kv_cache_memory_gib = 1.0 }', "unknown key"),
    ],
)
def test_server_table_is_validated(arm: str, message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_spec(_spec(arm))


def test_server_table_parses() -> None:
    spec = parse_spec(_spec('engine = "openai"\nserver = { kind = "llamacpp", cache_type_k = "q8_0", threads = 2 }'))
    server = spec.arms["baseline"].server
    assert server is not None and server.kind == "llamacpp" and server.cache_type_k == "q8_0" and server.threads == 2


def test_vllm_server_args_take_lists_and_tables() -> None:
    spec = parse_spec(_spec('engine = "openai"\nserver = { kind = "vllm", args = { enable_prefix_caching = false, '
                            'compilation_config = { mode = 0 }, middleware = ["a.B"], kv_cache_memory_bytes = 1073741824 } }'))
    server = spec.arms["baseline"].server
    assert server is not None and server.args == {"enable_prefix_caching": False, "compilation_config": {"mode": 0},
                                                  "middleware": ["a.B"], "kv_cache_memory_bytes": 1 << 30}


@pytest.mark.vllm
@pytest.mark.slow
def test_a_misspelled_candidate_flag_is_refused_before_the_baseline_runs(tmp_path: Path) -> None:
    from evals.errors import EngineError
    from qa.api import run

    vllm_python_or_skip()
    spec = parse_spec(
        'name = "typo"\nmodel = "smollm2-135m"\n[[tasks]]\nname = "gsm8k"\nlimit = 1\nmax_tokens = 4\n'
        '[arms.baseline]\nengine = "hf"\n[arms.candidate]\nengine = "openai"\n'
        'server = { kind = "vllm", args = { enable_prefix_cachng = false, kv_cache_memory_bytes = 1073741824 } }\n')
    run_dir = tmp_path / "run"
    with pytest.raises(EngineError, match="arm 'candidate': vLLM .* refuses its arguments: unknown vLLM argument "
                                          "'enable_prefix_cachng'; did you mean 'enable_prefix_caching'"):
        run(spec, run_dir, data_dir=_data_dir(), spec_dir=None)
    assert not (run_dir / "records" / "baseline").exists()  # refused in preflight: the baseline never started


def _data_dir() -> Path:
    return shared_data_dir()


def _qa_run(spec: Path, run: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QA_DATA_DIR": str(_data_dir()), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "qa.cli", "run", str(spec), "--out", str(run)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.slow
def test_qa_run_starts_and_stops_llamacpp_servers(tmp_path: Path) -> None:
    pytest.importorskip("xllamacpp", reason="xllamacpp (llama.cpp server wheel) is not installed")
    from evals.errors import ModelError
    from evals.models.gguf import gguf_file

    try:
        gguf_file("smollm2-135m")
    except ModelError as exc:
        pytest.skip(str(exc))
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'name = "llamacpp-pair"\nmodel = "smollm2-135m"\n'
        '[arms.baseline]\nengine = "openai"\nengine_args = { concurrency = 2 }\n'
        'server = { kind = "llamacpp", n_ctx = 4096, n_parallel = 2 }\n'
        '[arms.candidate]\nengine = "openai"\nengine_args = { concurrency = 2 }\n'
        'server = { kind = "llamacpp", cache_type_k = "q8_0", cache_type_v = "q8_0", n_ctx = 4096, n_parallel = 2 }\n'
        '[[tasks]]\nname = "gsm8k"\nlimit = 3\nnum_fewshot = 1\nmax_tokens = 12\n'
    )
    run = tmp_path / "run"
    first = _qa_run(spec, run)
    assert first.returncode in (0, 1, 3), first.stderr[-2000:]  # a verdict, whichever it is
    started = re.findall(r"(baseline|candidate): llamacpp server on http://127\.0\.0\.1:(\d+)/v1 \(pid (\d+)",
                         first.stdout)
    assert [role for role, _, _ in started] == ["baseline", "candidate"], first.stdout[-2000:]
    assert not any(alive(int(pid)) for _, _, pid in started)  # both stopped by pid
    for role in ("baseline", "candidate"):
        records = read_records(run / "records" / role / "gsm8k.jsonl")
        assert len(records) == 3 and all(r.error is None and r.completion is not None for r in records)
        assert "llama" in (run / "logs" / f"{role}-server.log").read_text(errors="replace")
    assert "q8_0" in (run / "logs" / "candidate-server.log").read_text(errors="replace")
    assert (run / "verdict.json").is_file()

    before = {p: p.read_bytes() for p in run.glob("records/*/*.jsonl")}
    again = _qa_run(spec, run)  # every record on disk: no server starts, nothing is re-run
    assert again.returncode == first.returncode, again.stderr[-2000:]
    assert "llamacpp server on" not in again.stdout and again.stdout.count("nothing to run") == 2
    assert {p: p.read_bytes() for p in run.glob("records/*/*.jsonl")} == before
