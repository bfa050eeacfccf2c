"""`qa run --dry-run` of the long-session and retrieval tasks: their options refused in one line
before anything loads, and the power plan showing what each runs, planned on the items its gated estimate
pairs (a session task: its turns on one cache path, not every path's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evals.errors import EvalError
from qa import api
from qa.files.spec import parse_spec
from tests.shared_data import shared_data_dir

ROOT = Path(__file__).resolve().parents[3]
HEAD = 'name = "dry"\nmodel = "smollm2-135m"\n[arms.baseline]\nengine = "hf"\n[arms.candidate]\nengine = "hf"\n'
AGENTIC = ('[[tasks]]\nname = "agentic"\noptions = { sessions = 2, turns = 8, session_tokens = 2048, '
           'context_tokens = 1024, paths = ["cold", "warm"] }\n')
RULER = '[[tasks]]\nname = "ruler"\noptions = { lengths = [1024, 2048], per_cell = 2 }\n'


def test_the_plan_counts_one_path_and_says_what_each_task_runs() -> None:
    plan = {t.task: t for t in api.dry_run(parse_spec(HEAD + AGENTIC + RULER), data_dir=shared_data_dir()).plan.tasks}
    assert plan["agentic"].items == 2 * 8  # 32 items (2 paths); the estimate pairs the cold path's 16
    assert "2 sessions x 8 turns (4 tool, 2 lookup, 2 gsm8k), to ~2048 tokens, served cold, warm" in plan["agentic"].note
    assert "CR1 with 1 df" in plan["agentic"].note
    assert plan["ruler"].items == 4 * 2 * 2 and "lengths 1024, 2048 x 2: 8 items per length" in plan["ruler"].note


@pytest.mark.parametrize(("options", "match"), [
    ('[[tasks]]\nname = "agentic"\noptions = { turnz = 8 }\n', r"agentic: unknown option\(s\) \['turnz'\]"),
    ('[[tasks]]\nname = "agentic"\noptions = { cycle = ["tool", "chat"] }\n', "option cycle must be"),
    ('[[tasks]]\nname = "ruler"\noptions = { lengths = [64] }\n', "option lengths must be"),
    ('[[tasks]]\nname = "agentic_bfcl"\noptions = { session_tokens = 9000 }\n', "session_tokens is not read"),
])
def test_a_bad_option_is_refused_by_the_dry_run(options: str, match: str) -> None:
    with pytest.raises(EvalError, match=match):
        api.dry_run(parse_spec(HEAD + options), data_dir=shared_data_dir())


def test_the_cli_refuses_a_bad_option_in_one_line_with_exit_2(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(HEAD + '[[tasks]]\nname = "ruler"\noptions = { subtasks = ["qa_1"] }\n')
    out = subprocess.run([sys.executable, "-m", "qa.cli", "run", str(spec), "--dry-run"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=False, env={**os.environ, "QA_DATA_DIR": str(shared_data_dir())})
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if "subtasks" in ln]
    assert len(lines) == 1 and "Traceback" not in out.stderr


def test_a_replay_window_larger_than_the_models_sliding_window_is_refused_by_the_dry_run(tmp_path: Path) -> None:
    """The model's config decides (no weights loaded): a tiny Gemma-3 with a sliding window of 6 (and a context
    window that holds the 1K ruler items: every item is checked against it before any arm starts)."""
    from tests.tiny_models import tiny_gemma3, tiny_tokenizer

    tiny_gemma3(max_position_embeddings=8192).save_pretrained(tmp_path / "gemma")
    tiny_tokenizer().save_pretrained(tmp_path / "gemma")
    head = HEAD.replace('"smollm2-135m"', f'"{tmp_path / "gemma"}"')
    kv = '[arms.candidate.engine_args.kv]\nformat = "nvfp4"\nprefix_cache = { block = 2, replay_window = REPLAY }\n'
    ruler = '[[tasks]]\nname = "ruler"\noptions = { lengths = [1024], per_cell = 1 }\n'
    assert api.dry_run(parse_spec(head + kv.replace("REPLAY", "6") + ruler), data_dir=shared_data_dir()).plan.tasks
    spec = tmp_path / "spec.toml"
    spec.write_text(head + kv.replace("REPLAY", "7") + ruler)
    out = subprocess.run([sys.executable, "-m", "qa.cli", "run", str(spec), "--dry-run"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=False, env={**os.environ, "QA_DATA_DIR": str(shared_data_dir())})
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if "replay_window 7" in ln]
    assert len(lines) == 1 and "larger than the model's sliding window (6 positions)" in lines[0]
    assert "Traceback" not in out.stderr


def test_bounded_replay_on_the_packaged_smollm2_is_refused_by_the_dry_run_in_one_line(tmp_path: Path) -> None:
    """SmolLM2-135M (the packaged model) has no sliding-window layer: a replay would recompute positions whose
    every input is cached, and vLLM replays only sliding-window KV groups (evals.engines.hf.fit)."""
    kv = ('[arms.candidate.engine_args.kv]\nformat = "nvfp4"\nrecent_window = 128\n'
          'prefix_cache = { block = 64, replay_window = 128 }\n')
    spec = tmp_path / "spec.toml"
    spec.write_text(HEAD + kv + AGENTIC)
    out = subprocess.run([sys.executable, "-m", "qa.cli", "run", str(spec), "--dry-run"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=False, env={**os.environ, "QA_DATA_DIR": str(shared_data_dir())})
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out.stderr
    assert "prefix_cache.replay_window 128 needs a model with sliding-window layers, and this one has none" in errors[0]
    assert "set replay_window = 0" in errors[0]
