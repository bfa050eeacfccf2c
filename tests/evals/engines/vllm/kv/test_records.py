"""The qa_kv plugin's records checked against the processes that load the model (no vllm needed): one record
per tensor / pipeline / context / data-parallel rank, written by evals.engines.vllm.kv.record itself into
a folder (the offline engine) or logged (a server), fewer refused, records that disagree refused; and the
environment a vLLM server gets from its `kv` table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from evals.engines.vllm.kv.record import (
    ExpectedLoads,
    PluginRecord,
    RewrittenLayer,
    checked_record,
    expected_loads,
    records_from_log,
    write_record,
)
from evals.engines.vllm.kv.spec import PLUGIN_ENV
from evals.engines.vllm.kv.switch import loaded_record
from evals.errors import EngineError
from evals.servers.commands import kv_plugin_env, server_env
from evals.servers.spec import VllmServerSpec
from evals.servers.start import check_plugin_ran
from quant.kv.spec import kv_spec_from_dict

KV = kv_spec_from_dict({"format": "nvfp4", "scales": "constant", "constant_scale": 0.004})
SPEC = {"format": "nvfp4", "scales": "constant", "constant_scale": 0.004}
LAYERS = 4


def _layer(i: int, scale: float = 0.004, fmt: str = "nvfp4") -> RewrittenLayer:
    return RewrittenLayer(name=f"model.layers.{i}.self_attn.attn", layer=i, kind="attention", format=fmt,
                          k_scale=[scale], v_scale=[scale])


def _record(pid: int, layers: Sequence[int | RewrittenLayer] = range(LAYERS), **change: object) -> PluginRecord:
    """One process's record: `layers` by index (rewritten as nvfp4 at 0.004) or as given."""
    rewritten = [r if isinstance(r, RewrittenLayer) else _layer(r) for r in layers]
    return PluginRecord(vllm="0.32.0", pid=pid, spec=SPEC, layers=rewritten).model_copy(update=change)


def _folder(tmp_path: Path, *records: PluginRecord) -> Path:
    """A record folder as the plugin leaves it: one kv-<pid>-<load>.json per load, written by write_record."""
    folder = tmp_path / "records"
    for record in records:
        write_record(record, folder)
    return folder


@pytest.mark.parametrize(("flags", "want"), [
    ({}, ExpectedLoads(1, 1)),
    ({"tensor_parallel_size": 4}, ExpectedLoads(4, 1)),
    ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "data_parallel_size": 2}, ExpectedLoads(8, 2)),
    ({"tensor-parallel-size": "2", "enable_expert_parallel": True}, ExpectedLoads(2, 1)),  # EP adds no process
    ({"tensor_parallel_size": 2, "prefill_context_parallel_size": 2}, ExpectedLoads(4, 1)),
    ({"tensor_parallel_size": 2, "distributed_executor_backend": "external_launcher"}, ExpectedLoads(1, 1)),
])
def test_the_processes_that_load_the_model_come_from_the_parallel_sizes(flags, want) -> None:
    assert expected_loads(flags) == want


def test_a_parallel_size_that_is_not_a_count_is_refused() -> None:
    for bad in ("two", 0, True):
        with pytest.raises(EngineError, match="tensor_parallel_size"):
            expected_loads({"tensor_parallel_size": bad})


def test_every_tensor_parallel_worker_recorded_the_same_load(tmp_path: Path) -> None:
    folder = _folder(tmp_path, _record(101), _record(102))
    got = loaded_record(folder, {"tensor_parallel_size": 2})
    assert got.pid in (101, 102) and [r.layer for r in got.layers] == list(range(LAYERS))
    assert loaded_record(_folder(tmp_path / "one", _record(7))).pid == 7  # no flags: one process


def test_a_worker_without_the_plugin_refuses_the_arm(tmp_path: Path) -> None:
    folder = _folder(tmp_path, _record(101))  # tensor parallel 2: the second worker wrote nothing
    with pytest.raises(EngineError, match=r"recorded 1 model loads \(pids 101\), but 2 processes") as err:
        loaded_record(folder, {"tensor_parallel_size": 2})
    assert "\n" not in str(err.value)
    with pytest.raises(EngineError, match="recorded no model load"):
        loaded_record(_folder(tmp_path / "none"), {})
    folder = _folder(tmp_path / "dp", *(_record(p) for p in range(3)))
    with pytest.raises(EngineError, match="3 model loads .* but 4 processes"):
        loaded_record(folder, {"tensor_parallel_size": 2, "data_parallel_size": 2})


def test_records_that_disagree_refuse_the_arm(tmp_path: Path) -> None:
    tp2 = {"tensor_parallel_size": 2}
    other_scale = _record(102, layers=[_layer(0), _layer(1, scale=0.5), _layer(2), _layer(3)])
    other_format = _record(102, layers=[_layer(i, fmt="none" if i == 3 else "nvfp4") for i in range(LAYERS)])
    at = r"layer model\.layers\.{}\.self_attn\.attn: ".format  # the first layer that differs
    cases = [
        (_record(102, spec={**SPEC, "constant_scale": 0.5}), "pid 101 ran kv spec"),
        (other_scale, at(1) + r"nvfp4 scales k \[0\.004\] v \[0\.004\] in pid 101, nvfp4 scales k \[0\.5\]"),
        (other_format, at(3) + "nvfp4 .* in pid 101, none .* in pid 102"),
        (_record(102, range(LAYERS - 1)), "disagree on the layers: " + at(3) + "nvfp4 .* in pid 101, not rewritten"),
    ]
    for n, (second, match) in enumerate(cases):
        folder = tmp_path / str(n)
        write_record(_record(101), folder)
        write_record(second, folder)
        with pytest.raises(EngineError, match=match) as err:
            checked_record(sorted([_record(101), second], key=lambda r: r.pid), expected_loads(tp2), "vllm")
        assert "\n" not in str(err.value)
        with pytest.raises(EngineError, match="disagree"):
            loaded_record(folder, tp2)


def test_pipeline_stages_hold_disjoint_layers_and_are_merged(tmp_path: Path) -> None:
    pp2 = {"pipeline_parallel_size": 2, "tensor_parallel_size": 2}
    first, second = range(2), range(2, LAYERS)
    stages = [_record(1, first), _record(2, first), _record(3, second), _record(4, second)]
    got = loaded_record(_folder(tmp_path, *stages), pp2)
    assert [r.layer for r in got.layers] == list(range(LAYERS))  # the stages' layers, in layer order
    with pytest.raises(EngineError, match="recorded 3 model loads"):
        loaded_record(_folder(tmp_path / "short", *stages[:3]), pp2)
    overlapping = [_record(1, first), _record(2, first), _record(3, range(1, LAYERS)), _record(4, range(1, LAYERS))]
    with pytest.raises(EngineError, match="disagree on the layers"):
        loaded_record(_folder(tmp_path / "overlap", *overlapping), pp2)
    lopsided = [_record(1, first), _record(2, first), _record(3, first), _record(4, second)]
    with pytest.raises(EngineError, match="has 1 of its 2 records"):
        loaded_record(_folder(tmp_path / "lopsided", *lopsided), pp2)
    with pytest.raises(EngineError, match="where 2 pipeline stages split them"):
        loaded_record(_folder(tmp_path / "unsplit", *(_record(p) for p in range(4))), pp2)


def test_a_servers_log_needs_one_record_per_worker(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    spec = VllmServerSpec(model=tmp_path, args={"tensor_parallel_size": 2}, kv=KV)
    earlier = "(EngineCore pid=90) INFO qa_kv plugin: 4 attention layers rewritten\n" + _record(90).line() + "\n"
    one = f"(Worker_TP0 pid=101) INFO {_record(101).line()}\n"
    log.write_text(earlier + one)
    start = len(earlier.encode())
    with pytest.raises(EngineError, match=r"server's log .* recorded 1 model loads \(pids 101\), but 2"):
        check_plugin_ran(spec, log, start)  # the earlier start's record does not count for this one
    log.write_text(earlier + one + f"(Worker_TP1 pid=102) INFO {_record(102).line()}\n")
    check_plugin_ran(spec, log, start)
    assert [r.pid for r in records_from_log(log.read_text())] == [90, 101, 102]
    check_plugin_ran(VllmServerSpec(model=tmp_path, args={"tensor_parallel_size": 2}), log, start)  # no kv: off


def test_the_servers_kv_table_wins_over_its_env(tmp_path: Path) -> None:
    env = server_env(VllmServerSpec(model=tmp_path, kv=KV, env={"VLLM_CPU_KVCACHE_SPACE": "1"}))
    assert env[PLUGIN_ENV] == kv_plugin_env(VllmServerSpec(model=tmp_path, kv=KV))[PLUGIN_ENV]
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    both = VllmServerSpec(model=tmp_path, kv=KV, env={PLUGIN_ENV: '{"format":"none"}'})
    with pytest.raises(EngineError, match=f"env.{PLUGIN_ENV} and a kv table both switch") as err:
        server_env(both)
    assert "\n" not in str(err.value)
    with pytest.raises(EngineError, match="unchecked") as err:  # no kv table: the switch would run unchecked
        server_env(VllmServerSpec(model=tmp_path, env={PLUGIN_ENV: '{"format":"none"}'}))
    assert "\n" not in str(err.value)


def test_a_drafter_loaded_in_the_same_process_keeps_its_own_record(tmp_path: Path) -> None:
    drafter = _record(101, range(1), load=1, role="drafter")
    folder = _folder(tmp_path, _record(101), drafter)
    assert sorted(p.name for p in folder.iterdir()) == ["kv-101-0.json", "kv-101-1.json"]  # nothing overwritten
    got = loaded_record(folder)
    assert got.role == "target" and [r.layer for r in got.layers] == list(range(LAYERS))
    old = _record(5).model_dump(mode="json")
    del old["load"], old["role"]  # a record written before loads were numbered still reads, as a target
    assert PluginRecord.model_validate(old).role == "target"
