"""Bad input, tried systematically against the real CLI: every case is one `error:` line on stderr,
exit code 2, no traceback, and a finished file planted in the output folder left byte-identical.

Each case builds its inputs under tmp_path and runs the CLI's entry point (`qa.cli.main`, what
`python -m qa.cli` runs) with the data folder in the environment and the case's folder as the working
directory: the cases in SUBPROCESS_CASES (a spec, a model folder and a data file refused, one after a model
load) as real `python -m qa.cli` processes, concurrently, the others one after another in this process
(the same code path without paying the CLI's imports 40 times). Cases that load no model stop before any
work: `qa run` checks every name, file and argument of a spec up front (qa.pipeline.stages.preflight).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from evals.records.samples import SampleRecord, sha256_text, write_records
from qa.cli.main import main as cli_main
from tests.evals.lmeval_fixtures import mc_lines, write_run
from tests.shared_data import shared_data_dir

ROOT = Path(__file__).resolve().parent.parent
FINISHED = {"report.html": "<html>finished run</html>\n", "verdict.json": '{"status": "pass"}\n',
            "comparison.json": '{"finished": true}\n'}

GOOD_SPEC = """\
name = "bad-input"
model = "smollm2-135m"
seed = 3
[arms.baseline]
engine = "hf"
[arms.candidate]
engine = "hf"
engine_args = { kv = { format = "nvfp4", scales = "dynamic" } }
[[tasks]]
name = "arc_easy"
limit = 4
"""


def _data_dir() -> Path:
    return shared_data_dir("arc_easy")


def _plant(out: Path, spec_text: str | None) -> None:
    """A folder holding a finished run: its spec (so `qa run` of that spec resumes there) and results."""
    out.mkdir(parents=True, exist_ok=True)
    if spec_text is not None:
        from qa.errors import SpecError
        from qa.files.spec import dump_spec, parse_spec

        with contextlib.suppress(SpecError):  # an invalid spec never gets this far: no spec.toml planted
            (out / "spec.toml").write_text(dump_spec(parse_spec(spec_text)))
    for name, text in FINISHED.items():
        (out / name).write_text(text)


def _spec(tmp: Path, text: str, *extra: str) -> list[str]:
    spec = tmp / "spec.toml"
    spec.write_text(text)
    _plant(tmp / "out", text)
    return ["run", str(spec), "--out", str(tmp / "out"), *extra]


def _swap(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


def _data_copy(tmp: Path, data: Path, skip: str) -> Path:
    """A data folder linking every dataset of `data` except `skip`."""
    copy = tmp / "data"
    copy.mkdir()
    for p in data.iterdir():
        if p.name != skip:
            (copy / p.name).symlink_to(p)
    return copy


# ------------------------------------------------------------------------------------ cases


def case_toml(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, GOOD_SPEC.replace("[arms.baseline]", "[arms.baseline"))


def case_unknown_key(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _swap(GOOD_SPEC, "seed = 3", "seed = 3\nsed = 4"))


def case_bad_value(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _swap(GOOD_SPEC, "limit = 4", "limit = 0"))


def case_unknown_engine_arg(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _swap(GOOD_SPEC, 'engine = "hf"\n[arms.candidate]',
                            'engine = "hf"\nengine_args = { batch_sise = 4 }\n[arms.candidate]'))


def case_unknown_engine(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _swap(GOOD_SPEC, 'engine = "hf"\n[arms.candidate]', 'engine = "hff"\n[arms.candidate]'))


def case_unknown_task(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _swap(GOOD_SPEC, '"arc_easy"', '"arc_eazy"'))


def case_unknown_format(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _swap(GOOD_SPEC, '"nvfp4"', '"nvfp5"'))


def case_renamed_format(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _swap(GOOD_SPEC, '"nvfp4"', '"int4"'))


def case_unknown_model(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _swap(GOOD_SPEC, '"smollm2-135m"', '"smollm9-135m"'))


def case_policy_unknown_key(tmp: Path, data: Path) -> list[str]:
    (tmp / "policy.toml").write_text("[default]\nmargn = 0.02\n")
    return _spec(tmp, _swap(GOOD_SPEC, "seed = 3", 'seed = 3\npolicy = "policy.toml"'))


def case_policy_missing(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _swap(GOOD_SPEC, "seed = 3", 'seed = 3\npolicy = "no-such-policy.toml"'))


def case_data_dir_missing(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, GOOD_SPEC, "--data-dir", str(tmp / "no-such-data"))


def case_data_file_missing(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, GOOD_SPEC, "--data-dir", str(_data_copy(tmp, data, skip="arc_easy")))


def case_data_file_truncated(tmp: Path, data: Path) -> list[str]:
    copy = _data_copy(tmp, data, skip="arc_easy")
    (copy / "arc_easy").mkdir()
    raw = (data / "arc_easy" / "arc_easy.jsonl").read_bytes()
    (copy / "arc_easy" / "arc_easy.jsonl").write_bytes(raw[: len(raw) // 2])  # cut mid-line
    return _spec(tmp, GOOD_SPEC, "--data-dir", str(copy))


def case_gpqa_wrong_password(tmp: Path, data: Path) -> list[str]:
    copy = _data_copy(tmp, data, skip="gpqa")
    (copy / "gpqa").mkdir()
    src = tmp / "src" / "dataset"
    src.mkdir(parents=True)
    (src / "gpqa_diamond.csv").write_text("Question,Correct Answer\nq,a\n")
    subprocess.run(["zip", "-q", "-r", "-P", "not-the-password", str(copy / "gpqa" / "dataset.zip"), "dataset"],
                   cwd=tmp / "src", check=True)
    return _spec(tmp, _swap(GOOD_SPEC, '"arc_easy"', '"gpqa_diamond_zeroshot"'), "--data-dir", str(copy))


def case_nan_scales(tmp: Path, data: Path) -> list[str]:
    import torch
    from safetensors.torch import save_file

    amax = torch.full((30,), 2.0)
    amax[7] = float("nan")
    save_file({"k_amax": amax, "v_amax": torch.full((30,), 2.0), "k_scale": torch.full((30,), 2.0 / 2688),
               "v_scale": torch.full((30,), 2.0 / 2688)}, str(tmp / "nan.safetensors"),
              metadata={"format": "nvfp4", "convention": "decode: d = amax / 2688"})
    meta = {"format": "nvfp4", "convention": "decode: d = amax / 2688", "observer": "absmax", "granularity": "tensor",
            "num_layers": 30, "num_kv_heads": 3, "model": "smollm2-135m", "seed": 0,
            "data": {"name": "wikitext2", "sha256": "0" * 64, "n_samples": 2, "seq_len": 64}}
    (tmp / "nan.json").write_text(json.dumps(meta))
    return _spec(tmp, _swap(GOOD_SPEC, 'scales = "dynamic" }', f'scales = "static" }}, scales = "{tmp / "nan.safetensors"}"'))


def case_other_run(tmp: Path, data: Path) -> list[str]:
    args = _spec(tmp, GOOD_SPEC)
    (tmp / "spec.toml").write_text(_swap(GOOD_SPEC, "limit = 4", "limit = 5"))  # the folder holds limit 4
    return args


def case_foreign_folder(tmp: Path, data: Path) -> list[str]:
    args = _spec(tmp, GOOD_SPEC)
    (tmp / "out" / "spec.toml").unlink()  # results but no spec: not a run folder of ours
    return args


def _compare(tmp: Path, base: Path, cand: Path) -> list[str]:
    _plant(tmp / "out", None)
    return ["compare", str(base), str(cand), "--out", str(tmp / "out"), "--bootstrap", "0"]


def case_lmeval_missing_items(tmp: Path, data: Path) -> list[str]:
    write_run(tmp / "base", {"arc_easy": mc_lines([1, 0, 1, 1, 0, 1])})
    write_run(tmp / "cand", {"arc_easy": mc_lines([1, 0, 1, 1])})
    return _compare(tmp, tmp / "base", tmp / "cand")


def case_lmeval_mismatched_items(tmp: Path, data: Path) -> list[str]:
    write_run(tmp / "base", {"arc_easy": mc_lines([1, 0, 1, 1])})
    write_run(tmp / "cand", {"arc_easy": mc_lines([1, 0, 1, 1], prompt_tag="Other prompt. ")})
    return _compare(tmp, tmp / "base", tmp / "cand")


def case_lmeval_folder_empty(tmp: Path, data: Path) -> list[str]:
    write_run(tmp / "base", {"arc_easy": mc_lines([1, 0, 1, 1])})
    (tmp / "cand").mkdir()
    return _compare(tmp, tmp / "base", tmp / "cand")


def _records(folder: Path, arm: str, version: str) -> None:
    recs = [SampleRecord(task="arc_easy", task_version=version, arm=arm, item_id=str(i),
                         prompt_hash=sha256_text(f"Question {i}"), scores={"acc,none": float(i % 2)})
            for i in range(6)]
    write_records(folder / "arc_easy.jsonl", recs)


def case_records_other_version(tmp: Path, data: Path) -> list[str]:
    _records(tmp / "base", "baseline", "1")
    _records(tmp / "cand", "candidate", "2")
    return _compare(tmp, tmp / "base", tmp / "cand")


def case_records_torn_middle(tmp: Path, data: Path) -> list[str]:
    _records(tmp / "base", "baseline", "1")
    _records(tmp / "cand", "candidate", "1")
    path = tmp / "cand" / "arc_easy.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + lines[2][:40] + "\n" + "".join(lines[3:]))  # not a crash artefact
    return _compare(tmp, tmp / "base", tmp / "cand")


RULER_LONG = """
[[tasks]]
name = "ruler"
max_tokens = 32
options = { lengths = [65536], per_cell = 1, subtasks = ["niah_single"] }
"""


def case_ruler_beyond_window_dry(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, GOOD_SPEC + RULER_LONG, "--dry-run")


def case_ruler_beyond_window(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, GOOD_SPEC + RULER_LONG)


NEEDLE_LONG = """
[[tasks]]
name = "needle"
options = { lengths = [16384], per_cell = 1 }
"""
SESSION_ARMS = """
[arms.baseline]
engine = "hf"
engine_args = { kv = { format = "none", prefix_cache = { enabled = true } } }
[arms.candidate]
engine = "hf"
engine_args = { kv = { format = "nvfp4", scales = "dynamic", prefix_cache = { enabled = true } } }
"""
# SmolLM2-135M's window is 8192 tokens: 64 GSM8K turns (a problem and its worked solution each) are ~13K, 160
# agentic turns (a tool call with its result, a look-up or a GSM8K problem each) ~19K
SESSIONS_LONG = 'name = "sessions"\noptions = { sessions = 1, turns = 64, asks = "gsm8k" }\n'
AGENTIC_LONG = ('name = "agentic"\nmax_tokens = 96\noptions = { sessions = 1, turns = 160, session_tokens = 4096, '
                'context_tokens = 1536, paths = ["cold", "warm"] }\n')
LLAMACPP_ARMS = """
[arms.baseline]
engine = "openai"
server = { kind = "llamacpp", n_ctx = 8192, n_parallel = 4 }
[arms.candidate]
engine = "openai"
server = { kind = "llamacpp", cache_type_k = "q8_0", cache_type_v = "q8_0", n_ctx = 8192, n_parallel = 4 }
"""


def _session_spec(task: str) -> str:
    head = GOOD_SPEC.split("[arms.baseline]")[0]
    return head + SESSION_ARMS + "[[tasks]]\n" + task


def case_needle_beyond_window_dry(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, GOOD_SPEC + NEEDLE_LONG, "--dry-run")


def case_sessions_too_many_turns_dry(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _session_spec(SESSIONS_LONG), "--dry-run")


def case_sessions_too_many_turns(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _session_spec(SESSIONS_LONG))


def case_agentic_too_many_turns_dry(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _session_spec(AGENTIC_LONG), "--dry-run")


def case_ruler_beyond_llamacpp_slot_dry(tmp: Path, data: Path) -> list[str]:
    # a 4096-token haystack fits the model (8192) but not one of llama.cpp's 4 slots of n_ctx 8192 (2048 each)
    head = GOOD_SPEC.split("[arms.baseline]")[0]
    return _spec(tmp, head + LLAMACPP_ARMS + _swap(RULER_LONG, "[65536]", "[4096]"), "--dry-run")


def _model_folder(tmp: Path, edit: Callable[[dict], object] | None = None, text: str | None = None,
                  drop: str | None = None) -> Path:
    """A copy of the tiny random Llama's folder (`outcomes` saves it beside the cases), its config.json edited,
    replaced or a file dropped."""
    folder = tmp / "model"
    shutil.copytree(tmp.parent / "tiny", folder)
    config = folder / "config.json"
    if edit is not None:
        loaded = json.loads(config.read_text())
        edit(loaded)
        config.write_text(json.dumps(loaded))
    if text is not None:
        config.write_text(text)
    if drop is not None:
        (folder / drop).unlink()
    return folder


def _on(folder: Path) -> str:
    return _swap(GOOD_SPEC, '"smollm2-135m"', f'"{folder}"')


def case_config_wrong_type_dry(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _on(_model_folder(tmp, lambda c: c.update(num_hidden_layers="two"))), "--dry-run")


def case_config_wrong_type_run(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _on(_model_folder(tmp, lambda c: c.update(num_attention_heads=2.5))))


def case_config_wrong_type_kv_inspect(tmp: Path, data: Path) -> list[str]:
    folder = _model_folder(tmp, lambda c: c.update(max_position_embeddings="4k"))
    _plant(tmp / "out", None)
    return ["kv-inspect", "--model", str(folder), "--n-prompts", "1", "--seq-len", "16"]


def case_config_wrong_type_calibrate(tmp: Path, data: Path) -> list[str]:
    folder = _model_folder(tmp, lambda c: c.update(num_key_value_heads="1"))
    _plant(tmp / "out", None)
    return ["calibrate", "--model", str(folder), "--out", str(tmp / "out" / "scales.safetensors")]


def case_config_wrong_type_eval(tmp: Path, data: Path) -> list[str]:
    folder = _model_folder(tmp, lambda c: c.update(hidden_size=[64]))
    _plant(tmp / "out", None)
    return ["eval", "--model", str(folder), "--arm", "baseline", "--tasks", "arc_easy", "--limit", "2", "--out",
            str(tmp / "out")]


def case_config_a_list(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _on(_model_folder(tmp, text="[1, 2]")), "--dry-run")


def case_config_not_json(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _on(_model_folder(tmp, text='{"model_type": "llama",')))


def case_config_no_model_type(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _on(_model_folder(tmp, lambda c: c.pop("model_type"))), "--dry-run")


def case_folder_no_tokenizer(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, _on(_model_folder(tmp, drop="tokenizer.json")))


def case_folder_no_weights(tmp: Path, data: Path) -> list[str]:
    folder = _model_folder(tmp, drop="model.safetensors")
    _plant(tmp / "out", None)
    return ["kv-inspect", "--model", str(folder), "--n-prompts", "1", "--seq-len", "16"]


def case_ruler_lengths_not_a_list(tmp: Path, data: Path) -> list[str]:
    return _spec(tmp, GOOD_SPEC + _swap(RULER_LONG, "lengths = [65536]", 'lengths = "8k"'), "--dry-run")


@dataclass(frozen=True)
class Case:
    build: Callable[[Path, Path], list[str]]
    needle: str  # what the one error line must name (case-insensitive)


CASES: dict[str, Case] = {
    "malformed toml": Case(case_toml, "not valid TOML"),
    "unknown spec key": Case(case_unknown_key, "sed"),
    "bad spec value": Case(case_bad_value, "limit"),
    "unknown engine argument": Case(case_unknown_engine_arg, "batch_sise"),
    "unknown engine": Case(case_unknown_engine, "engine"),
    "unknown task": Case(case_unknown_task, "arc_eazy"),
    "unknown KV format": Case(case_unknown_format, "nvfp5"),
    "KV format under its old name": Case(case_renamed_format, "'int4' is now called 'qa_int4'"),
    "unknown model": Case(case_unknown_model, "smollm9-135m"),
    "policy with unknown key": Case(case_policy_unknown_key, "margn"),
    "policy file missing": Case(case_policy_missing, "no-such-policy.toml"),
    "data folder missing": Case(case_data_dir_missing, "no-such-data"),
    "data file missing": Case(case_data_file_missing, "arc_easy"),
    "data file truncated": Case(case_data_file_truncated, "arc_easy"),
    "wrong GPQA password": Case(case_gpqa_wrong_password, "password"),
    "NaN in scales file": Case(case_nan_scales, "NaN"),
    "folder holds another run": Case(case_other_run, "holds another run"),
    "folder holds foreign files": Case(case_foreign_folder, "not empty"),
    "lm-eval folder missing items": Case(case_lmeval_missing_items, "arc_easy"),
    "lm-eval folders with mismatched items": Case(case_lmeval_mismatched_items, "prompt"),
    "lm-eval folder empty": Case(case_lmeval_folder_empty, "samples"),
    "records from another task version": Case(case_records_other_version, "version"),
    "records corrupt mid-file": Case(case_records_torn_middle, "corrupt"),
    "RULER length beyond the window (dry run)": Case(case_ruler_beyond_window_dry, "context window"),
    "RULER length beyond the window": Case(case_ruler_beyond_window, "context window"),
    "needle length beyond the window (dry run)": Case(case_needle_beyond_window_dry, "context window"),
    "sessions with too many turns (dry run)": Case(case_sessions_too_many_turns_dry, "sessions do not fit"),
    "sessions with too many turns": Case(case_sessions_too_many_turns, "sessions do not fit"),
    "agentic with too many turns (dry run)": Case(case_agentic_too_many_turns_dry, "lower its session_tokens"),
    "RULER length beyond a llama.cpp slot (dry run)": Case(case_ruler_beyond_llamacpp_slot_dry, "n_ctx 8192 over 4 slots"),
    "config.json wrong type (dry run)": Case(case_config_wrong_type_dry, "num_hidden_layers"),
    "config.json wrong type (run)": Case(case_config_wrong_type_run, "num_attention_heads"),
    "config.json wrong type (kv-inspect)": Case(case_config_wrong_type_kv_inspect, "max_position_embeddings"),
    "config.json wrong type (calibrate)": Case(case_config_wrong_type_calibrate, "num_key_value_heads"),
    "config.json wrong type (eval)": Case(case_config_wrong_type_eval, "hidden_size"),
    "config.json a list": Case(case_config_a_list, "JSON object"),
    "config.json not JSON": Case(case_config_not_json, "config.json"),
    "config.json without model_type": Case(case_config_no_model_type, "model_type"),
    "model folder without tokenizer": Case(case_folder_no_tokenizer, "tokenizer"),
    "model folder without weights": Case(case_folder_no_weights, "model.safetensors"),
    "RULER lengths not a list": Case(case_ruler_lengths_not_a_list, "lengths"),
}


@dataclass(frozen=True)
class Outcome:
    rc: int
    stderr: str
    planted: dict[str, bytes | None]  # finished files after the command (None: gone)


# run as real `python -m qa.cli` processes: the whole path a user's shell takes, for a sample of the cases
SUBPROCESS_CASES = ("malformed toml", "unknown model", "wrong GPQA password", "config.json wrong type (run)")


def _env(data: Path) -> dict[str, str]:
    return {"QA_DATA_DIR": str(data), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _planted(tmp: Path) -> dict[str, bytes | None]:
    out = tmp / "out"
    return {n: (out / n).read_bytes() if (out / n).exists() else None for n in FINISHED}


def _case_dir(name: str, root: Path) -> Path:
    tmp = root / name.replace(" ", "_")
    tmp.mkdir()
    return tmp


def _run_process(tmp: Path, args: list[str], data: Path) -> Outcome:
    proc = subprocess.run([sys.executable, "-m", "qa.cli", *args], cwd=tmp, env={**os.environ, **_env(data)},
                          capture_output=True, text=True, timeout=600, check=False)
    return Outcome(proc.returncode, proc.stderr, _planted(tmp))


def _run_here(name: str, root: Path, data: Path) -> Outcome:
    tmp = _case_dir(name, root)
    args = CASES[name].build(tmp, data)
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in _env(data).items():
            mp.setenv(key, value)
        mp.chdir(tmp)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                cli_main(args)
                rc = 0
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
    return Outcome(rc, err.getvalue(), _planted(tmp))


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    data = _data_dir()
    if shutil.which("zip") is None:
        pytest.skip("the zip tool is needed to build a GPQA zip with a wrong password")
    root = tmp_path_factory.mktemp("bad_input")
    from tests.evals.hf_fixtures import save_tiny

    save_tiny(root / "tiny")  # once, before the threads: transformers' lazy imports are not thread-safe
    built = {name: (tmp := _case_dir(name, root), CASES[name].build(tmp, data)) for name in SUBPROCESS_CASES}
    with ThreadPoolExecutor(max_workers=len(SUBPROCESS_CASES)) as pool:  # the processes run beside the others
        futures = {name: pool.submit(_run_process, *built[name], data) for name in SUBPROCESS_CASES}
        here = {name: _run_here(name, root, data) for name in CASES if name not in SUBPROCESS_CASES}
        return {**here, **{name: f.result() for name, f in futures.items()}}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2_and_touches_no_finished_file(name: str, outcomes: dict[str, Outcome]) -> None:
    got = outcomes[name]
    assert "Traceback" not in got.stderr, got.stderr
    errors = [line for line in got.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, got.stderr
    assert CASES[name].needle.lower() in errors[0].lower(), errors[0]
    assert got.rc == 2, got.stderr
    assert got.planted == {n: t.encode() for n, t in FINISHED.items()}
