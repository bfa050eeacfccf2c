"""Security: no unpickling anywhere, trust_remote_code off unless the spec says so, and an API key
planted in the environment reaches the configured server but no file, log or report of a run
(which also says that its server engine is not deterministic)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qa.files.spec import parse_spec
from tests.evals.engines.openai_api.fake_server import FakeServer
from tests.shared_data import shared_data_dir

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("quant", "evals", "qa", "benchmarks", "scripts", "examples")
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _kw(call: ast.Call, name: str) -> Any:
    for k in call.keywords:
        if k.arg == name:
            return k.value.value if isinstance(k.value, ast.Constant) else "<expr>"
    return None


def _unsafe_calls(tree: ast.AST) -> list[str]:
    """Unpickling calls and imports, and remote code switched on by a literal."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found += [f"line {node.lineno}: imports {n}" for n in names if n.split(".")[0] in PICKLE_MODULES]
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        if (func == "torch.load" or func.endswith(".torch.load")) and _kw(node, "weights_only") is not True:
            found.append(f"line {node.lineno}: {func} without weights_only=True")
        if func.split(".")[-1] == "load" and func.split(".")[0] in ("np", "numpy") and _kw(node, "allow_pickle"):
            found.append(f"line {node.lineno}: {func} with allow_pickle")
        if _kw(node, "trust_remote_code") is True:
            found.append(f"line {node.lineno}: {func} with trust_remote_code=True")
    return found


def test_the_scanner_catches_what_it_looks_for() -> None:
    bad = ("import pickle\nfrom joblib import load\nimport torch\ntorch.load('x')\n"
           "torch.load('x', weights_only=False)\nimport numpy as np\nnp.load('x', allow_pickle=True)\n"
           "f(trust_remote_code=True)\n")
    assert len(_unsafe_calls(ast.parse(bad))) == 6
    assert _unsafe_calls(ast.parse("import torch\ntorch.load('x', weights_only=True)\nf(trust_remote_code=flag)\n")) == []


def test_no_module_unpickles_or_enables_remote_code() -> None:
    sources = _sources()
    assert len(sources) > 40  # the scan sees the whole code base
    problems = [f"{p.relative_to(ROOT)} {msg}" for p in sources for msg in _unsafe_calls(ast.parse(p.read_text()))]
    assert problems == []


class _Stop(BaseException):
    """Raised by the spy: the load is stopped once its arguments are seen (a BaseException, so the loader's
    turning of any load failure into a one-line ModelError does not swallow it)."""


def _spy_loads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record the keyword arguments of every transformers from_pretrained call, then stop the load."""
    import transformers

    calls: list[dict[str, Any]] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        raise _Stop

    for cls in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        monkeypatch.setattr(cls, "from_pretrained", spy)
    return calls


@pytest.mark.parametrize("spec_says", [None, False, True])
def test_trust_remote_code_reaches_transformers_only_when_the_spec_says_so(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec_says: bool | None) -> None:
    from evals.engines import build_engine
    from evals.models.resolve import resolve_model
    from qa.files.rundir import RunDir
    from qa.pipeline.resolve import engine_args

    line = "" if spec_says is None else f"trust_remote_code = {str(spec_says).lower()}\n"
    spec = parse_spec(f'name = "t"\n{line}[arms.baseline]\n[arms.candidate]\n[[tasks]]\nname = "arc_easy"\n')
    calls = _spy_loads(monkeypatch)
    with pytest.raises(_Stop):
        build_engine("hf", resolve_model("smollm2-135m"), engine_args(spec, "candidate", RunDir(tmp_path)))
    assert calls and calls[0]["trust_remote_code"] is bool(spec_says)


SPEC = """\
name = "secret"
model = "smollm2-135m"
seed = 5
[arms.baseline]
engine = "openai"
engine_args = {{ base_url = "{url}", api_key_env = "QA_TEST_PLANTED_KEY", concurrency = 2, timeout_s = 10.0 }}
[arms.candidate]
engine = "openai"
engine_args = {{ base_url = "{url}", api_key_env = "QA_TEST_PLANTED_KEY", concurrency = 2, timeout_s = 10.0 }}
[[tasks]]
name = "gsm8k"
limit = 4
max_tokens = 8
"""


def test_planted_api_key_reaches_the_server_and_no_output_file(tmp_path: Path) -> None:
    secret = "sk-planted-7f3a9c1e5b2d4f6a8c0e"
    data = str(shared_data_dir("gsm8k"))
    server = FakeServer(tmp_path)
    server.start()
    try:
        spec = tmp_path / "spec.toml"
        spec.write_text(SPEC.format(url=server.base_url))
        run = tmp_path / "run"
        env = {**os.environ, "QA_TEST_PLANTED_KEY": secret, "QA_DATA_DIR": data, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run([sys.executable, "-m", "qa.cli", "run", str(spec), "--out", str(run)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=600, check=False)
    finally:
        server.stop()
    assert proc.returncode in (0, 1, 3), proc.stderr[-3000:]
    requests = server.requests()
    assert len(requests) >= 8  # both arms talked to the server ...
    assert {r["auth"] for r in requests} == {f"Bearer {secret}"}  # ... with the key
    assert {r["path"] for r in requests} <= {"/v1/completions", "/v1/models"}  # only under the base URL
    files = [p for p in run.rglob("*") if p.is_file()]
    assert {"env.json", "report.html", "report.md", "comparison.json", "verdict.json"} <= {p.name for p in files}
    assert len(list(run.glob("records/*/gsm8k.jsonl"))) == 2
    leaks = [str(p.relative_to(run)) for p in files if secret.encode() in p.read_bytes()]
    leaks += [name for name, text in (("stdout", proc.stdout), ("stderr", proc.stderr)) if secret in text]
    assert leaks == []
    assert b"QA_TEST_PLANTED_KEY" in (run / "spec.toml").read_bytes()  # the variable's name is kept, not its value
    report = (run / "report.md").read_text()
    assert "Not deterministic" in report and "engine 'openai'" in report  # a server engine is not bit-reproducible
