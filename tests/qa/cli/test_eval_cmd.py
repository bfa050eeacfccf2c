"""`qa eval` end to end on a tiny random Llama folder and the shared ARC-Easy data: records written
once per item, a rerun resumes without duplicates, an emulated-KV arm differs in its scores, and bad
input is one line with exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.records.samples import read_records
from tests.evals.hf_fixtures import save_tiny
from tests.qa.cli.test_compare_cmd import run_cli
from tests.shared_data import shared_data_dir


def _data_dir() -> Path:
    return shared_data_dir()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


def _eval(folder: Path, out: Path, arm: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    return run_cli(["eval", "--model", str(folder), "--tasks", "arc_easy", "--arm", arm, "--out", str(out),
                    "--limit", "6", "--data-dir", str(_data_dir()), "--no-progress", *extra], capsys)


def test_eval_writes_resumes_and_emulates_kv(tiny_folder: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    rc, _, err = _eval(tiny_folder, out, "baseline", capsys)
    assert rc == 0, err
    path = out / "records" / "baseline" / "arc_easy.jsonl"
    first = read_records(path)
    assert len(first) == 6 and len({r.item_id for r in first}) == 6
    assert all(r.error is None for r in first)

    rc, _, err = _eval(tiny_folder, out, "baseline", capsys)  # same command again: nothing new
    assert rc == 0, err
    assert read_records(path) == first

    rc, _, err = _eval(tiny_folder, out, "candidate", capsys, "--kv", "nvfp4")
    assert rc == 0, err
    cand = read_records(out / "records" / "candidate" / "arc_easy.jsonl")
    assert [r.item_id for r in cand] == [r.item_id for r in first]  # same seeded subset
    # NVFP4 KV moves the per-choice log-likelihoods (scores may or may not flip on 6 items)
    assert any(a.choice_loglikelihoods != b.choice_loglikelihoods for a, b in zip(first, cand, strict=True))


def test_eval_other_settings_in_the_same_folder_are_refused(tiny_folder: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert _eval(tiny_folder, out, "baseline", capsys)[0] == 0
    before = (out / "records" / "baseline" / "arc_easy.jsonl").read_bytes()
    rc, _, err = _eval(tiny_folder, out, "baseline", capsys, "--kv", "nvfp4")
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert (out / "records" / "baseline" / "arc_easy.jsonl").read_bytes() == before  # nothing lost


@pytest.mark.parametrize("extra", [["--tasks", "arc_eazy"], ["--kv", "nvfp5"], ["--engine-arg", "batch_size"]])
def test_eval_bad_input_is_one_line(tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    extra: list[str]) -> None:
    args = ["eval", "--model", str(tiny_folder), "--tasks", "arc_easy", "--arm", "b", "--out", str(tmp_path / "r"),
            "--limit", "2", "--data-dir", str(_data_dir()), "--no-progress"]
    if extra[0] == "--tasks":
        args[args.index("--tasks") + 1] = extra[1]
    else:
        args += extra
    rc, _, err = run_cli(args, capsys)
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "r" / "records" / "b").exists()  # the corrected command is not refused later
