"""Folders llm-compressor itself writes (tests.llmc_folders) through `qa kv-inspect` and `qa run`'s preflight
(qa.pipeline.scale_fit): the 4-bit float folder is read as amax/6 and fitted so, the FP8 one as amax/448, and
a folder whose convention file says NVFP4 decode scales over those amax/6 numbers is refused in one line,
exit 2, before any arm starts, unless the kv spec says scales_as_is = true: for an hf arm, and for the vLLM
arms whose kv table switches the qa_kv plugin on (engine_args.kv, a vLLM server's kv), fitted on the same
model with transformers (the dry run; vLLM itself is never started here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from evals.servers.interpreter import VLLM_PYTHON_ENV
from qa import api
from qa.files.spec import parse_spec
from qa.pipeline.dry_run import PlannedArm
from quant.errors import QuantError
from quant.scales.folder import CONVENTION_FILE
from tests.llmc_folders import LlmcFolders, llmc_folders
from tests.qa.cli.test_compare_cmd import run_cli
from tests.quant.ckpt_folders import k_scale_folder
from tests.shared_data import shared_data_dir

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
HEAD = 'name = "fit"\nmodel = "smollm2-135m"\n[[tasks]]\nname = "wikitext_kl"\nlimit = 2\n[arms.baseline]\nengine = "hf"\n'


def _arm(name: str, folder: Path, extra: str = "") -> str:
    return (f'[arms.{name}]\nengine = "hf"\nengine_args = {{ kv = {{ format = "nvfp4", scales = "{folder}"{extra} }} '
            "}\n")


def _plugin(name: str, folder: Path, extra: str = "") -> str:
    """A vllm arm whose engine_args.kv switches the qa_kv plugin on with the folder's scales."""
    return (f'[arms.{name}]\nengine = "vllm"\nengine_args = {{ kv = {{ format = "nvfp4", scales = "{folder}"{extra} '
            "} }\n")


def _served(name: str, folder: Path, extra: str = "") -> str:
    """An openai arm whose vLLM server's kv switches the qa_kv plugin on with the folder's scales."""
    return (f'[arms.{name}]\nengine = "openai"\nserver = {{ kind = "vllm", args = {{ max_model_len = 2048 }}, '
            f'kv = {{ format = "nvfp4", scales = "{folder}"{extra} }} }}\n')


def _scale_note(arm: PlannedArm) -> str:
    [note] = [n for n in arm.notes if n.startswith("K/V scales of")]
    return note


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> LlmcFolders:
    return llmc_folders(tmp_path_factory)


@pytest.fixture(scope="module")
def misdeclared(made: LlmcFolders, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 4-bit folder (amax/6) with a convention file saying nvfp4-decode (amax/2688): 448x off."""
    folder = tmp_path_factory.mktemp("misdeclared") / "fp4"
    folder.mkdir()
    for path in made.folder("fp4").iterdir():
        os.link(path, folder / path.name)
    (folder / CONVENTION_FILE).write_text(json.dumps({"convention": "nvfp4-decode"}))
    return folder


def test_kv_inspect_reads_each_folder_as_its_writer_meant(made: LlmcFolders, capsys: pytest.CaptureFixture[str]) -> None:
    for scheme, declared in (("fp4", "nvfp4-global"), ("fp8", "fp8-decode")):
        rc, out, err = run_cli(["kv-inspect", "--scales", str(made.folder(scheme)), "--format", "nvfp4",
                                "--data-dir", str(shared_data_dir()), "--n-prompts", "2", "--seq-len", "64",
                                "--json"], capsys)
        assert rc == 0, err
        check = json.loads(out)["scales_check"]
        assert (check["declared"], check["fit"], check["expected"]) == (declared, declared, "nvfp4-decode")
        assert check["reading"]["read_as"] == "nvfp4-decode" and check["reading"]["problems"] == []
        warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
        assert not any("but the numbers fit" in w for w in warnings)  # declared and fitted agree
        factor = "448" if scheme == "fp4" else "6"  # for a reader that takes them as they are (vLLM)
        assert any(f"off by the factor {factor} between conventions (too large)" in w for w in warnings)
        assert f"converted from {declared}" in err
        assert ("refuses a kv_cache_scheme of num_bits=4" in err) is (scheme == "fp4")


def test_the_dry_run_fits_each_folder_before_any_arm(made: LlmcFolders, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "no-python"))  # no vLLM: nothing of it starts here
    spec = parse_spec(HEAD + _arm("fp4", made.folder("fp4")) + _arm("fp8", made.folder("fp8"))
                      + _plugin("plugin", made.folder("fp8")) + _served("served", made.folder("fp4")))
    arms = {a.name: a for a in api.dry_run(spec, data_dir=shared_data_dir()).arms}
    fp4 = _scale_note(arms["fp4"])
    assert "declared nvfp4-global (amax / 6, compressed-tensors kv_cache_scheme num_bits=4 float tensor" in fp4
    assert "fit nvfp4-global" in fp4 and "smollm2-135m on wikitext2: 4 x 128 tokens" in fp4
    assert fp4.endswith("the hf emulator's nvfp4 cache reads them as nvfp4-decode (amax / 2688)")
    fp8 = _scale_note(arms["fp8"])
    assert "declared fp8-decode (amax / 448" in fp8 and "fit fp8-decode" in fp8
    # the vLLM arms' folders are fitted on the same model, loaded with transformers here (one load per model:
    # the same observation, so the same median ratio as the hf arm's fit of the same folder)
    plugin, served = _scale_note(arms["plugin"]), _scale_note(arms["served"])
    assert plugin.replace("the vLLM qa_kv plugin's", "the hf emulator's") == fp8
    assert served.replace("the vLLM qa_kv plugin's", "the hf emulator's") == fp4
    assert "fit fp8-decode" in plugin and "fit nvfp4-global" in served


def test_a_misdeclared_folder_is_refused_in_one_line_unless_taken_as_it_is(misdeclared: Path, tmp_path: Path) -> None:
    with pytest.raises(QuantError, match=r"declared nvfp4-decode \(amax / 2688\) but the numbers fit nvfp4-global "
                                         r"\(amax / 6\): off by 448x"):
        api.dry_run(parse_spec(HEAD + _arm("candidate", misdeclared)), data_dir=shared_data_dir())
    spec = tmp_path / "spec.toml"
    spec.write_text(HEAD + _arm("candidate", misdeclared))
    env = {**os.environ, "QA_DATA_DIR": str(shared_data_dir()), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "qa.cli", "run", str(spec), "--out", str(tmp_path / "run")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("error: arm 'candidate': ") and "scales_as_is = true" in lines[0]
    assert not (tmp_path / "run" / "records").exists()  # no arm started
    taken = parse_spec(HEAD + _arm("candidate", misdeclared, ", scales_as_is = true"))
    note = _scale_note(api.dry_run(taken, data_dir=shared_data_dir()).arms[1])
    assert "fit nvfp4-global" in note and "taken as it is: declared nvfp4-decode" in note


@pytest.mark.parametrize("arm", [_plugin, _served], ids=["engine_args.kv", "server.kv"])
def test_a_vllm_arms_misdeclared_folder_is_refused_before_any_arm(arm: Callable[..., str], misdeclared: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "no-python"))  # the refusal needs no vLLM
    with pytest.raises(QuantError, match=r"^arm 'candidate': .*declared nvfp4-decode \(amax / 2688\) but the numbers "
                                         r"fit nvfp4-global \(amax / 6\): off by 448x.*scales_as_is = true") as err:
        api.dry_run(parse_spec(HEAD + arm("candidate", misdeclared)), data_dir=shared_data_dir())
    assert "\n" not in str(err.value)
    taken = parse_spec(HEAD + arm("candidate", misdeclared, ", scales_as_is = true"))
    note = _scale_note(api.dry_run(taken, data_dir=shared_data_dir()).arms[1])
    assert "fit nvfp4-global" in note and "taken as it is: declared nvfp4-decode" in note
    assert "the vLLM qa_kv plugin's nvfp4 cache reads them as nvfp4-decode" in note


def test_a_folder_whose_model_is_not_here_is_noted_by_the_dry_run(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "no-python"))
    folder = k_scale_folder(tmp_path / "fp8", [0.02, 0.03], [0.01, 0.04], num_bits=8)  # a hand-built FP8 folder
    absent = tmp_path / "absent-model"
    arm = _plugin("candidate", folder) + f'model = "{absent}"\n'
    note = _scale_note(api.dry_run(parse_spec(HEAD + arm), data_dir=shared_data_dir()).arms[1])
    assert "declared fp8-decode" in note and "not fitted (its model is not on this machine: " in note
    assert "`qa run` refuses them unless it can fit them: run where its model loads, or set scales_as_is" in note
    taken = _plugin("candidate", folder, ", scales_as_is = true") + f'model = "{absent}"\n'
    note = _scale_note(api.dry_run(parse_spec(HEAD + taken), data_dir=shared_data_dir()).arms[1])
    assert "not fitted (its model is not on this machine: " in note and "`qa run` refuses" not in note
