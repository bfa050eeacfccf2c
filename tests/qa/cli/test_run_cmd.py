"""`qa run --dry-run` on every shipped example: each spec is valid, its tasks' data read, every arm planned."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shared_data import shared_data_dir

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_shipped_example_dry_runs(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from qa.cli import main
    from qa.files.spec import load_spec

    with pytest.raises(SystemExit) as info:
        main(["run", str(path), "--dry-run", "--data-dir", str(shared_data_dir("gsm8k"))])
    out = capsys.readouterr()
    assert info.value.code == 0, out.err[-1500:]
    spec = load_spec(path)
    for arm in spec.arms:
        assert f"\n{arm}: engine=" in out.out.replace("\n\n", "\n")  # every arm, candidates by their names


def test_the_deepseek_specs_compare_three_candidates_with_an_unoptimized_baseline() -> None:
    from qa.files.spec import RunSpec, load_spec

    for name in ("deepseek_v4_flash_low_latency.toml", "deepseek_v4_flash_throughput.toml"):
        spec = load_spec(next(p for p in EXAMPLES if p.name == name))
        assert spec.candidates == ["nvfp4_kv", "replay", "nvfp4_kv_and_replay"] and "rerun" in spec.arms
        def flags(arm: str, spec: RunSpec = spec) -> dict[str, object]:
            a = spec.arms[arm]
            return dict(a.server.args) if a.server is not None else a.given_args()

        assert (flags("baseline")["kv_cache_dtype"], flags("baseline")["swa_bounded_replay"]) == ("auto", False)
        assert flags("rerun") == flags("baseline")
        want = {"nvfp4_kv": ("nvfp4", False), "replay": ("auto", True), "nvfp4_kv_and_replay": ("nvfp4", True)}
        for arm, (dtype, replay) in want.items():
            f = flags(arm)
            assert (f["kv_cache_dtype"], f["swa_bounded_replay"]) == (dtype, replay)
            # each candidate differs from the baseline only in what it names
            assert {k for k in f if f[k] != flags("baseline")[k]} == \
                {k for k, on in (("kv_cache_dtype", dtype != "auto"), ("swa_bounded_replay", replay)) if on}


@pytest.mark.parametrize("name", ["deepseek_v4_flash_low_latency.toml", "deepseek_v4_flash_throughput.toml"])
def test_the_deepseek_margins_are_reachable_at_their_items_and_repeats(name: str) -> None:
    """Each task's margin in the specs' policy is one its item count can reach at its repeats (qa plan's
    model: worst-case accuracy 0.5, half of Var(d) sampling noise at temperature 0.6)."""
    from evals.tasks import get_task
    from qa.files.policy import resolve_policy
    from qa.files.spec import load_spec
    from qa.pipeline.resolve import resolve_task_options
    from qa.plan.sample_size import sample_size_plan

    path = next(p for p in EXAMPLES if p.name == name)
    spec = load_spec(path)
    policy = resolve_policy(spec.policy, path.parent)
    for t in spec.tasks:
        task = get_task(t.name, resolve_task_options(t, spec.chat))
        items = len(task.items(shared_data_dir(t.name.split("_")[0])))
        rho = 0.6 if t.name == "gsm8k" else 0.5
        plan = sample_size_plan(t.name, policy.for_task(t.name).margin, rho=rho, within_share=0.5, n_items=items)
        row = next(r for r in plan.rows if r.repeats == t.repeats)
        assert row.items_needed <= items, (t.name, row, items)
