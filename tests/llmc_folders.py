"""KV-scale folders written by llm-compressor itself (made once, for every test process that shares them):
tests/quant/llmc_oneshot.py run in .venv-llmc (scripts/setup.sh --dev) on SmolLM2-135M-Instruct and 16
WikiText-2 lines, for every KV scheme llm-compressor 0.14 is asked for here (FP8 and 4-bit float per tensor,
FP8 per KV head; group-of-16 NVFP4, which it refuses). A test is skipped when .venv-llmc or the shared data
are missing. The first process to ask makes them, under a file lock, and the others read them. Where: in
$QA_TEST_LLMC_DIR when it is set (scripts/test.sh sets it for both of its suites and removes it, and makes the
folders there with `python -m tests.llmc_folders` beside the main suite's workers, so that no worker waits for
them), else, under pytest-xdist, in the temp folder all workers share (tests/conftest.py removes it when the
session ends), else in a temp folder of this process.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from evals.models.named import DEFAULT_MODEL
from evals.models.resolve import resolve_model
from tests.shared_data import shared_data_dir

ROOT = Path(__file__).resolve().parents[1]
LLMC_PYTHON = ROOT / ".venv-llmc" / "bin" / "python"
SCRIPT = ROOT / "tests" / "quant" / "llmc_oneshot.py"
SCHEMES = ("fp8", "fp4", "fp8-head", "nvfp4-group", "nvfp4-local")
WIKITEXT = "wikitext2/derived/wiki.test.raw"
TIMEOUT_S = 1200  # one process, five oneshot calls: about 3 to 4 minutes on 2 busy CPU cores
SHARED_NAME = "llmc-folders"  # the folders' name in a folder several processes share
SHARED_ENV = "QA_TEST_LLMC_DIR"  # that folder, for test sessions one after another (scripts/test.sh)


@dataclass(frozen=True)
class LlmcFolders:
    """Where the folders are, what the writer's observer saw, and what it refused."""

    root: Path
    model: Path  # the model folder the writer calibrated

    def folder(self, scheme: str) -> Path:
        """The saved folder of `scheme`."""
        return self.root / scheme

    def amax(self, scheme: str) -> dict[str, list]:
        """The writer's observer amax per layer (`k`, `v`), as tests/quant/llmc_oneshot.py records it."""
        return json.loads((self.root / f"{scheme}.amax.json").read_text())

    def refused(self, scheme: str) -> str | None:
        """The writer's one-line refusal of `scheme` (None: it wrote the folder)."""
        path = self.root / f"{scheme}.refused"
        return path.read_text().strip() if path.is_file() else None


def _oneshot(model: Path, text: Path, root: Path) -> None:
    """Run tests/quant/llmc_oneshot.py in .venv-llmc: each scheme's folder into `root` (which exists)."""
    proc = subprocess.run([str(LLMC_PYTHON), str(SCRIPT), str(model), str(text), str(root), *SCHEMES],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"llm-compressor's oneshot failed (rc {proc.returncode}): {proc.stderr[-2000:]}")


@functools.cache
def _made(model: Path, text: Path) -> LlmcFolders:
    root = Path(tempfile.mkdtemp(prefix="llmc-folders-"))
    atexit.register(shutil.rmtree, root, True)
    _oneshot(model, text, root)
    return LlmcFolders(root=root, model=model)


def _made_shared(model: Path, text: Path, root: Path) -> LlmcFolders:
    """The folders in `root`, made there by the first process to take the lock (a half-made `root`, left by
    a failed oneshot, is made again)."""
    done = root / ".done"
    with FileLock(f"{root}.lock"):
        if not done.is_file():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            _oneshot(model, text, root)
            done.touch()
    return LlmcFolders(root=root, model=model)


def llmc_folders(tmp_path_factory: pytest.TempPathFactory) -> LlmcFolders:
    """The folders (made on first use where they are shared, see above); skips without .venv-llmc or the
    shared data."""
    if not LLMC_PYTHON.is_file():
        pytest.skip("llm-compressor is not installed in .venv-llmc (scripts/setup.sh --dev)")
    text = shared_data_dir(WIKITEXT) / WIKITEXT
    model = resolve_model(DEFAULT_MODEL).path
    assert model is not None  # the packaged SmolLM2 resolves to a local folder
    if os.environ.get(SHARED_ENV):
        return _made_shared(model, text, Path(os.environ[SHARED_ENV]) / SHARED_NAME)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one of several worker processes: share the folders
        return _made_shared(model, text, tmp_path_factory.getbasetemp().parent / SHARED_NAME)
    return _made(model, text)


def main() -> int:
    """Make the folders in $QA_TEST_LLMC_DIR now (what the first test to ask would do); 0 also when they cannot be
    made here (no .venv-llmc, no shared data): the tests then skip or make them, and say why."""
    if not os.environ.get(SHARED_ENV) or not LLMC_PYTHON.is_file():
        return 0
    try:
        text = shared_data_dir(WIKITEXT) / WIKITEXT
    except pytest.skip.Exception:
        return 0
    model = resolve_model(DEFAULT_MODEL).path
    assert model is not None  # the packaged SmolLM2 resolves to a local folder
    _made_shared(model, text, Path(os.environ[SHARED_ENV]) / SHARED_NAME)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
