"""qa.pipeline.fits: each arm's context window before any arm starts, on SmolLM2-135M (8192 tokens) and its
tokenizer. An `openai` arm's server sets it (vLLM's max_model_len; llama.cpp's n_ctx shared by its slots), else the
model's config; an external server's window is unknown here, which the dry run says in one line per server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evals.errors import EvalError
from qa.files.spec import parse_spec
from qa.pipeline.fits import arm_limit, check_items_fit
from qa.pipeline.resolve import resolve_run
from qa.pipeline.resolved_run import ResolvedRun
from tests.shared_data import shared_data_dir

HEAD = 'name = "fits"\nmodel = "smollm2-135m"\nseed = 1\n'
RULER = ('[[tasks]]\nname = "ruler"\nmax_tokens = 32\n'
         'options = { lengths = [LENGTH], per_cell = 1, subtasks = ["niah_single"] }\n')


def _arms(server: str) -> str:
    return "".join(f'[arms.{name}]\nengine = "openai"\nserver = {{ {server} }}\n' for name in ("baseline", "candidate"))


def _resolve(arms: str, length: int) -> ResolvedRun:
    spec = parse_spec(HEAD + arms + RULER.replace("LENGTH", str(length)))
    run = resolve_run(spec, Path("unused"), data_dir=shared_data_dir("wikitext2"), spec_dir=None)
    if run.arms[0].model is None or run.arms[0].model.path is None:
        pytest.skip("smollm2-135m is not installed as a local model folder")
    return run


def test_a_vllm_servers_window_is_its_max_model_len_else_the_models_config() -> None:
    capped = _resolve(_arms('kind = "vllm", args = { max_model_len = 2048 }'), 4096)
    assert [arm_limit(a) for a in capped.arms] == [2048, 2048]
    with pytest.raises(EvalError, match=r"^task ruler: item 'niah_single/L4096/0' needs \d+ tokens .* more than the "
                                        r"2048-token context window of arm 'baseline' \(smollm2-135m on vLLM's server, "
                                        r"max_model_len 2048\); 1 of 1 items do not fit: lower its lengths option"):
        check_items_fit(capped)
    assert check_items_fit(_resolve(_arms('kind = "vllm"'), 4096)) == []  # the config's 8192


def test_a_llamacpp_slot_holds_n_ctx_over_n_parallel_tokens() -> None:
    two = _resolve(_arms('kind = "llamacpp", n_ctx = 4096, n_parallel = 2'), 1024)
    assert [arm_limit(a) for a in two.arms] == [2048, 2048]
    assert check_items_fit(two) == []
    four = _resolve(_arms('kind = "llamacpp", n_ctx = 2048, n_parallel = 4'), 1024)
    with pytest.raises(EvalError, match=r"more than the 512-token context window of arm 'baseline' \(smollm2-135m on "
                                        r"llama.cpp's server, n_ctx 2048 over 4 slots\)"):
        check_items_fit(four)


def test_an_external_servers_unknown_window_is_one_line_of_the_dry_run(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(HEAD + "".join(f'[arms.{name}]\nengine = "openai"\nengine_args = {{ base_url = "{url}" }}\n'
                                   for name, url in (("baseline", "http://127.0.0.1:9/v1"),
                                                     ("rerun", "http://127.0.0.1:9/v1"),
                                                     ("candidate", "http://127.0.0.1:10/v1")))
                    + RULER.replace("LENGTH", "65536"))
    env = {**os.environ, "QA_DATA_DIR": str(shared_data_dir("wikitext2")), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "qa.cli", "run", str(spec), "--dry-run", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr  # nothing here can count against an unknown window
    said = [line for line in proc.stdout.splitlines() if line.startswith("warning: arm")]
    unknown = ("the context window of an external server is unknown here, so items are not checked against it "
               "before the run")
    assert said == [f"warning: arms 'baseline', 'rerun' (openai at http://127.0.0.1:9/v1): {unknown}",
                    f"warning: arm 'candidate' (openai at http://127.0.0.1:10/v1): {unknown}"], proc.stdout
