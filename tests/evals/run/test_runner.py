"""The runner and arms: seeded subsets shared by both arms, resume after a kill without duplicates,
refusal to mix configurations, per-sample errors, and byte-identical records across reruns."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from evals.engines import base as engine_base
from evals.engines.base import TokenLogprobs
from evals.errors import EvalError, RecordError
from evals.records.arm_file import ARM_FILE
from evals.records.samples import read_records
from evals.run.arm import parse_arm, run_arm
from evals.run.runner import run_task
from evals.run.selection import sample_seed, select_items
from evals.tasks.base import Item, Request, Result, Scored, TaskKind

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------ fakes


@dataclass(frozen=True)
class EchoTask:
    """Generation task: the prompt is "say <n>", the answer is n; `fail_on` items fail to score."""

    n_items: int = 20
    version: str = "1"
    prompt_tag: str = "say"
    temperature: float = 0.0
    fail_on: tuple[str, ...] = ()
    name: str = "echo"
    kind: TaskKind = "generate"

    def items(self, data_dir: Path | None) -> list[Item]:
        return [Item(item_id=f"q{i}", doc={"n": i}, cluster=f"c{i % 3}") for i in range(self.n_items)]

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        return engine_base.GenerateRequest(prompt=f"{self.prompt_tag} {item.doc['n']}", max_tokens=4,
                               temperature=self.temperature, seed=seed if self.temperature else None)

    def prompt_text(self, request: Request) -> str:
        assert isinstance(request, engine_base.GenerateRequest)
        return request.prompt

    def score(self, item: Item, result: Result) -> Scored:
        assert isinstance(result, engine_base.GenerateResult)
        if item.item_id in self.fail_on:
            raise ValueError("unscorable")
        target = str(item.doc["n"])
        return Scored(scores={"exact_match,none": float(result.text.strip() == target)},
                      extracted={"none": result.text.strip()}, target=target)


class FakeEngine:
    """Answers "say n" with n (or n+1 when n is in `wrong`); engine_base.Failure for ids in `fail`; can stop
    (KeyboardInterrupt, as a kill) on its k-th call."""

    def __init__(self, wrong: set[int] = frozenset(), fail: set[int] = frozenset(), interrupt_on_call: int | None = None):
        self.info = engine_base.EngineInfo(name="fake", model="fake", deterministic=True)
        self.wrong, self.fail, self.interrupt_on_call = wrong, fail, interrupt_on_call
        self.calls = 0
        self.seen: list[str] = []

    def generate(self, requests: list[engine_base.GenerateRequest]) -> list[engine_base.GenerateResult | engine_base.Failure]:
        self.calls += 1
        if self.interrupt_on_call == self.calls:
            raise KeyboardInterrupt
        out: list[engine_base.GenerateResult | engine_base.Failure] = []
        for r in requests:
            self.seen.append(r.prompt)
            n = int(r.prompt.split()[-1])
            if n in self.fail:
                out.append(engine_base.Failure("boom"))
            else:
                text = str(n + (n in self.wrong) + (r.seed or 0) % 2 * 100 if r.temperature else n + (n in self.wrong))
                out.append(engine_base.GenerateResult(text=f" {text}", output_tokens=2, finish_reason="stop"))
        return out

    def loglikelihood(self, requests: list[engine_base.LoglikelihoodRequest]) -> list[engine_base.LoglikelihoodResult | engine_base.Failure]:
        raise NotImplementedError

    def token_logprobs(self, requests: list[engine_base.TokenLogprobsRequest]) -> list[TokenLogprobs | engine_base.Failure]:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------ sampling


def test_select_items_is_a_seeded_subset_not_the_first_n_and_order_free() -> None:
    items = EchoTask(n_items=100).items(None)
    a = select_items(items, 10, seed=7)
    assert len(a) == 10
    assert [it.item_id for it in a] != [it.item_id for it in items[:10]]
    assert [it.item_id for it in a] == [it.item_id for it in items if it in a]  # dataset order kept
    assert {it.item_id for it in select_items(items[::-1], 10, seed=7)} == {it.item_id for it in a}
    assert {it.item_id for it in select_items(items, 10, seed=8)} != {it.item_id for it in a}
    assert {it.item_id for it in a} <= {it.item_id for it in select_items(items, 30, seed=7)}  # nested
    assert select_items(items, None, 0) == items and select_items(items, 500, 0) == items
    with pytest.raises(EvalError):
        select_items(items, 0, 0)


def test_sample_seeds_differ_per_repeat_and_fit_int64() -> None:
    seeds = {sample_seed(0, "t", f"q{i}", r) for i in range(50) for r in range(4)}
    assert len(seeds) == 200 and all(0 <= s < 2**63 for s in seeds)
    assert sample_seed(0, "t", "q1", 0) == sample_seed(0, "t", "q1", 0) != sample_seed(1, "t", "q1", 0)


# ------------------------------------------------------------------------------------ runner


def test_records_scores_errors_and_subset_identical_across_arms(tmp_path: Path) -> None:
    chosen = [int(it.item_id[1:]) for it in select_items(EchoTask().items(None), 8, seed=1)]
    unscorable, wrong, failing = chosen[0], chosen[1], chosen[2]
    task = EchoTask(fail_on=(f"q{unscorable}",))
    base = run_task(FakeEngine(), task, arm="base", out_path=tmp_path / "base.jsonl", limit=8, seed=1, progress=False)
    cand = run_task(FakeEngine(wrong={wrong}, fail={failing}), task, arm="cand", out_path=tmp_path / "cand.jsonl",
                    limit=8, seed=1, progress=False)
    assert (base.items, base.written, cand.written) == (8, 8, 8)
    assert (base.errors, cand.errors) == (1, 2)
    assert (base.output_tokens, cand.output_tokens) == (16, 14)  # 2 per answered sample; a engine_base.Failure has none
    b, c = read_records(tmp_path / "base.jsonl"), read_records(tmp_path / "cand.jsonl")
    assert [r.item_id for r in b] == [r.item_id for r in c] == [f"q{n}" for n in sorted(chosen)]
    assert [r.prompt_hash for r in b] == [r.prompt_hash for r in c]
    for rec in b:
        n = int(rec.item_id[1:])
        if n == unscorable:  # scoring raised: error, no scores, never a silent 0
            assert rec.error and rec.error.startswith("score: ValueError") and rec.scores == {}
        else:
            assert rec.error is None and rec.scores == {"exact_match,none": 1.0} and rec.target == str(n)
            assert rec.cluster == f"c{n % 3}" and rec.completion == f" {n}" and rec.finish_reason == "stop"
    by_id = {r.item_id: r for r in c}
    assert by_id[f"q{wrong}"].scores == {"exact_match,none": 0.0}
    assert by_id[f"q{failing}"].error == "engine: boom" and by_id[f"q{failing}"].scores == {}


def test_resume_after_a_kill_writes_each_sample_once_and_matches_a_clean_run(tmp_path: Path) -> None:
    task = EchoTask(n_items=10)
    clean = tmp_path / "clean.jsonl"
    run_task(FakeEngine(), task, arm="a", out_path=clean, repeats=2, chunk=4, progress=False)
    killed = tmp_path / "killed.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run_task(FakeEngine(interrupt_on_call=3), task, arm="a", out_path=killed, repeats=2, chunk=4, progress=False)
    assert len(read_records(killed)) == 8  # two chunks landed before the kill
    with open(killed, "a") as fh:  # a write torn by the kill
        fh.write('{"schema_version": 1, "task": "ec')
    engine = FakeEngine()
    summary = run_task(engine, task, arm="a", out_path=killed, repeats=2, chunk=4, progress=False)
    assert (summary.skipped, summary.written, summary.samples) == (8, 12, 20)
    assert len(engine.seen) == 12  # finished samples are not recomputed
    keys = [r.key for r in read_records(killed)]
    assert len(keys) == len(set(keys)) == 20
    assert killed.read_bytes() == clean.read_bytes()
    again = run_task(FakeEngine(), task, arm="a", out_path=killed, repeats=2, chunk=4, progress=False)
    assert again.written == 0 and killed.read_bytes() == clean.read_bytes()


@pytest.mark.parametrize("change", ["version", "prompt", "limit", "arm"])
def test_a_changed_spec_refuses_to_mix_and_writes_nothing(tmp_path: Path, change: str) -> None:
    path = tmp_path / "r.jsonl"
    task = EchoTask()
    run_task(FakeEngine(), task, arm="a", out_path=path, limit=6, progress=False)
    before = _sha(path)
    kwargs = {"arm": "a", "out_path": path, "limit": 6, "progress": False}
    if change == "version":
        task = replace(task, version="2")
    elif change == "prompt":
        task = replace(task, prompt_tag="tell")
    elif change == "limit":
        kwargs["limit"] = 4
    else:
        kwargs["arm"] = "b"
    with pytest.raises(RecordError, match="new output folder"):
        run_task(FakeEngine(), task, **kwargs)  # type: ignore[arg-type]
    assert _sha(path) == before


def test_sampled_repeats_get_distinct_per_repeat_seeds(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    run_task(FakeEngine(), EchoTask(n_items=4, temperature=0.7), arm="a", out_path=path, repeats=3, seed=5,
             progress=False)
    recs = read_records(path)
    assert len(recs) == 12
    for rec in recs:
        assert rec.meta["sample_seed"] == sample_seed(5, "echo", rec.item_id, rec.repeat)


def test_engine_crash_for_a_chunk_is_recorded_per_sample(tmp_path: Path) -> None:
    class Crashing(FakeEngine):
        def generate(self, requests):
            raise RuntimeError("device lost")

    path = tmp_path / "c.jsonl"
    summary = run_task(Crashing(), EchoTask(n_items=3), arm="a", out_path=path, progress=False)
    assert summary.errors == 3
    assert all(r.error == "engine: RuntimeError: device lost" and r.scores == {} for r in read_records(path))


# ------------------------------------------------------------------------------------ hf determinism


def test_hf_records_are_byte_identical_across_runs_greedy_and_sampled(tmp_path: Path) -> None:
    from tests.evals.hf_fixtures import tiny_engine

    for temperature in (0.0, 0.9):
        task = EchoTask(n_items=6, temperature=temperature)
        paths = []
        for run in range(2):
            path = tmp_path / f"t{temperature}-{run}.jsonl"
            run_task(tiny_engine({"batch_size": 4}), task, arm="a", out_path=path, repeats=2, seed=3, progress=False)
            paths.append(path)
        assert paths[0].read_bytes() == paths[1].read_bytes()
        assert len(read_records(paths[0])) == 12
    greedy = read_records(tmp_path / "t0.0-0.jsonl")
    sampled = read_records(tmp_path / "t0.9-0.jsonl")
    assert greedy[0].completion == greedy[1].completion  # greedy repeats agree
    assert any(a.completion != b.completion for a, b in zip(sampled[::2], sampled[1::2], strict=True))


# ------------------------------------------------------------------------------------ arms


def test_run_arm_writes_manifest_and_refuses_another_config(tmp_path: Path) -> None:
    from tests.evals.hf_fixtures import save_tiny

    model_dir = save_tiny(tmp_path / "tiny")
    config = parse_arm({"name": "base", "model": str(model_dir), "engine_args": {"batch_size": 2}, "limit": 3})
    task = EchoTask(n_items=5)
    run = tmp_path / "run"
    [summary] = run_arm(config, [task], run, progress=False)
    arm_dir = run / "records" / "base"
    assert summary.written == 3 and (arm_dir / "echo.jsonl").exists()
    manifest = json.loads((arm_dir / ARM_FILE).read_text())
    assert manifest["config"]["engine_args"] == {"batch_size": 2} and "echo" in manifest["tasks"]
    snapshot = {p.name: _sha(p) for p in arm_dir.iterdir()}

    [again] = run_arm(config, [task], run, progress=False)  # same config: resumes, nothing new
    assert again.written == 0 and again.skipped == 3
    other = parse_arm({"name": "base", "model": str(model_dir), "limit": 3,
                       "engine_args": {"batch_size": 2, "kv": {"format": "nvfp4"}}})
    with pytest.raises(RecordError, match="another configuration.*engine_args"):
        run_arm(other, [task], run, progress=False)
    with pytest.raises(RecordError, match="other options"):
        run_arm(config, [replace(task, n_items=6)], run, progress=False)
    assert {p.name: _sha(p) for p in arm_dir.iterdir()} == snapshot


# ------------------------------------------------------------------------------------ reasoning


@dataclass(frozen=True)
class ThinkTask(EchoTask):
    """EchoTask with its own reasoning delimiters."""

    think_tags: tuple[str, str] | None = ("<r>", "</r>")


class ReasoningEngine(FakeEngine):
    """Reasons before answering: n % 3 == 0 closes its reasoning and answers, 1 runs out of tokens
    inside it, 2 returns a server-style `reasoning` field and runs out inside it (no content)."""

    def generate(self, requests: list[engine_base.GenerateRequest]) -> list[engine_base.GenerateResult | engine_base.Failure]:
        out: list[engine_base.GenerateResult | engine_base.Failure] = []
        for r in requests:
            n = int(r.prompt.split()[-1])
            if n % 3 == 0:
                out.append(engine_base.GenerateResult(f"<r>{n} is {n}</r> {n}", 9, "stop"))
            elif n % 3 == 1:
                out.append(engine_base.GenerateResult(f"<r>{n} is", 4, "length"))
            else:
                out.append(engine_base.GenerateResult("", 4, "length", reasoning=f"{n} is"))
        return out


def test_only_the_answer_is_scored_and_truncation_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "think.jsonl"
    run_task(ReasoningEngine(), ThinkTask(n_items=6), arm="a", out_path=path, progress=False)
    by_n = {int(r.item_id[1:]): r for r in read_records(path)}
    for n in (0, 3):  # closed reasoning, answered: scored on the answer alone
        rec = by_n[n]
        assert (rec.completion, rec.reasoning, rec.truncated) == (f" {n}", f"{n} is {n}", False)
        assert rec.scores == {"exact_match,none": 1.0} and rec.finish_reason == "stop" and rec.output_tokens == 9
    for n in (1, 4):  # max_tokens inside the reasoning: truncated, scored as the task scores it (no answer)
        rec = by_n[n]
        assert (rec.completion, rec.reasoning, rec.truncated, rec.finish_reason) == ("", f"{n} is", True, "length")
        assert rec.scores == {"exact_match,none": 0.0} and rec.output_tokens == 4
    for n in (2, 5):  # the server split the reasoning off and never started the answer
        rec = by_n[n]
        assert (rec.completion, rec.reasoning, rec.truncated) == ("", f"{n} is", True)
    # a wrong but complete answer at a stop is not truncated; the default tags apply to a task without any
    run_task(FakeEngine(wrong={1}), EchoTask(n_items=3), arm="a", out_path=tmp_path / "plain.jsonl", progress=False)
    plain = read_records(tmp_path / "plain.jsonl")
    assert [r.truncated for r in plain] == [False] * 3 and [r.reasoning for r in plain] == [None] * 3
