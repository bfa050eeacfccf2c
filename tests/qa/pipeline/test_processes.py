"""Child processes of `qa run`: an arm's own `env` reaches its worker process (and so its server),
over this process's environment, with the offline defaults kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from qa.pipeline.processes import run_worker


def test_an_arms_env_reaches_its_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake-python"  # stands in for the arm's interpreter: writes its env and argv, exits 7
    dump = tmp_path / "env.txt"
    fake.write_text(f'#!/bin/sh\nenv > {dump}\necho "ARGV=$*" >> {dump}\nexit 7\n')
    fake.chmod(0o755)
    monkeypatch.setenv("QA_TEST_OVERRIDDEN", "parent")
    rc = run_worker(tmp_path / "run", "nvfp4_kv", str(fake),
                    {"VLLM_CPU_KVCACHE_SPACE": "4", "QA_TEST_OVERRIDDEN": "arm"})
    assert rc == 7
    lines = dump.read_text().splitlines()
    assert {"VLLM_CPU_KVCACHE_SPACE=4", "QA_TEST_OVERRIDDEN=arm", "HF_HUB_OFFLINE=1"} <= set(lines)
    assert f"ARGV=-m qa.pipeline.worker {tmp_path / 'run'} nvfp4_kv" in lines
