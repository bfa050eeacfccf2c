"""What the qa_kv plugin rewrote, as each vLLM process that loaded the model records it, and the arm's
KV provenance built from it ("emulated in vLLM": format, scales and their sha256, one entry per layer).

A process writes `<QA_VLLM_KV_RECORD>/kv-<pid>-<load>.json` (a PluginRecord: `load` counts the model loads
in that process, `role` says whether it is the target model or a speculative drafter, so a drafter loaded in
the same process never overwrites the target's) once its model is loaded and every attention layer checked; the offline engine reads the folder after `vllm.LLM(...)` returns, and the plugin
logs the same record as one line (`LOG_PREFIX` + JSON) so a server's log carries it (evals.provenance.server_log).
`checked_record` accepts them only when every process that loads the model recorded the same load (one
target record per tensor / pipeline / context / data-parallel rank, `expected_loads`; drafters' records are
checked the same way among themselves): one worker without the
plugin would otherwise run its share of the heads unemulated while the arm passes. Imports neither torch
nor vllm.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evals.engines.vllm.args import parallel_size, world_size
from evals.errors import EngineError
from evals.provenance.record import KVProvenance, LayerScales, ProvenanceSource, ScalesOrigin
from quant.fileio import atomic_write_text, scales_paths, sha256_file
from quant.kv.spec import KVQuantSpec
from quant.scales.conventions import VLLM_FOLDER_FORMATS, expected_convention
from quant.scales.folder import read_folder_scales

RECORD_SCHEMA = 1
LOG_PREFIX = "qa_kv plugin record: "  # the log line that carries a PluginRecord as JSON
LayerKind = Literal["attention", "mla"]
LoadRole = Literal["target", "drafter"]  # the model an engine serves, or its speculative-decoding drafter
COUNTS_METHOD = "qa_kv_counts"  # the worker method collective_rpc calls: every load's per-layer counters (JSON)
EXTERNAL_LAUNCHER = "external_launcher"  # torchrun-style: each process runs its own LLM for one rank
NO_RECORD_HINT = ("vLLM ran without it (is it installed in vLLM's interpreter, `pip install --no-deps -e .`, and "
                  "not left out by VLLM_PLUGINS?)")


class RewrittenLayer(BaseModel):
    """One attention layer the plugin rewrites: vLLM's name for it, its index, format and decode scales."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # vLLM's layer name (its prefix), e.g. model.layers.3.self_attn.attn
    layer: int = Field(ge=0)  # the index skip_layers / layer_formats / the scales file count in
    kind: LayerKind
    format: str
    k_scale: list[float] = Field(default_factory=list)  # decode scale(s); empty: self-scaled or none
    v_scale: list[float] = Field(default_factory=list)
    # per-head scales: the model's KV heads k_scale / v_scale belong to, in order (a tensor-parallel rank's
    # share, evals.engines.vllm.kv.heads); empty: one scale for every head
    kv_heads: list[int] = Field(default_factory=list)
    # what the layer caches per token over the model's KV heads (vLLM's Attention num_kv_heads times the
    # tensor-parallel ranks, at most the model's KV heads; head_size); None: MLA, or a record written before
    # they were kept
    num_kv_heads: int | None = None
    head_size: int | None = None


class PluginRecord(BaseModel):
    """What one vLLM process rewrites: the plugin's spec, vLLM's version, every attention layer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = RECORD_SCHEMA
    vllm: str
    pid: int
    load: int = Field(default=0, ge=0)  # which model load of this process (0: the first)
    role: LoadRole = "target"
    spec: dict[str, object]  # the KVQuantSpec as the plugin read it (its JSON dump)
    layers: list[RewrittenLayer]

    def line(self) -> str:
        """The record as the one log line the plugin writes."""
        return LOG_PREFIX + self.model_dump_json()


class LoadCounts(BaseModel):
    """What one model load's rewrites counted on the device (plugin.load_counts): per layer name,
    [tokens written to the cache, non-finite K/V elements]."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int
    load: int = Field(ge=0)
    role: LoadRole
    layers: dict[str, tuple[int, int]]


class LayerCount(BaseModel):
    """One layer's counts over an arm: tokens its cache write rewrote, non-finite K/V elements it stored."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int
    load: int = Field(ge=0)
    role: LoadRole
    name: str
    tokens: int
    nonfinite: int


class KVExecution(BaseModel):
    """The proof that the rewrites ran over an arm (arm.json `engine_info.kv_execution`, evals.engines.vllm.kv.
    proof): every layer's device counts against the tokens vLLM computed, and the refusal when they differ."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    expected_tokens: int  # prompt tokens less cached ones, plus generated tokens fed back, over the arm
    requests: int
    exact: bool  # every target layer must have counted exactly expected_tokens (else: at least)
    note: str | None = None  # why not exact
    refusal: str | None = None  # why the arm was refused (None: every layer's count checked out)
    layers: list[LayerCount] = Field(default_factory=list)


def write_record(record: PluginRecord, folder: Path) -> Path:
    """Write `folder/kv-<pid>-<load>.json` atomically; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"kv-{record.pid}-{record.load}.json"
    atomic_write_text(path, record.model_dump_json(indent=2) + "\n")
    return path


def read_records(folder: Path) -> list[PluginRecord]:
    """Every process's record in `folder` (oldest first); EngineError for a file that is not one."""
    out = []
    for path in sorted(folder.glob("kv-*.json"), key=os.path.getmtime):
        try:
            out.append(PluginRecord.model_validate_json(path.read_text(encoding="utf-8")))
        except (OSError, ValidationError) as exc:
            raise EngineError(f"{path}: not a qa_kv plugin record ({type(exc).__name__})") from None
    return out


def records_from_log(text: str) -> list[PluginRecord]:
    """Every plugin record a server log carries, in the order logged (a line that does not parse is skipped)."""
    found = []
    for line in text.splitlines():
        at = line.find(LOG_PREFIX)
        if at < 0:
            continue
        try:
            found.append(PluginRecord.model_validate(json.loads(line[at + len(LOG_PREFIX):])))
        except (ValueError, ValidationError):
            continue
    return found


def record_from_log(text: str) -> PluginRecord | None:
    """The last plugin record a server log carries (None: the plugin did not run in that server)."""
    found = records_from_log(text)
    return found[-1] if found else None


@dataclass(frozen=True)
class ExpectedLoads:
    """How many vLLM processes load the model, each writing one record, over how many pipeline stages
    (each stage's processes hold that stage's layers only)."""

    processes: int
    stages: int


def expected_loads(flags: Mapping[str, object]) -> ExpectedLoads:
    """The model loads one engine or server makes, from its flags (`vllm.LLM` keywords or a server's args):
    evals.engines.vllm.args.world_size (tensor x pipeline x prefill-context x data parallel); under vLLM's
    external_launcher each process runs its own engine for one rank, so one load per record folder."""
    if flags.get("distributed_executor_backend") == EXTERNAL_LAUNCHER:
        return ExpectedLoads(processes=1, stages=1)
    return ExpectedLoads(processes=world_size(flags), stages=parallel_size(flags, "pipeline_parallel_size"))


def _summary(record: PluginRecord) -> str:
    """What one process rewrote, in a few words: pid, layer count, formats."""
    formats = "/".join(sorted({r.format for r in record.layers})) or "no format"
    return f"pid {record.pid}: {len(record.layers)} layers, {formats}"


def _difference(a: PluginRecord, b: PluginRecord) -> str:
    """The first way two processes' records differ (one clause)."""
    if a.spec != b.spec or a.vllm != b.vllm:
        return f"pid {a.pid} ran kv spec {a.spec} on vLLM {a.vllm}, pid {b.pid} {b.spec} on vLLM {b.vllm}"
    mine, theirs = {r.name: r for r in a.layers}, {r.name: r for r in b.layers}
    for name in sorted(mine.keys() | theirs.keys()):
        if mine.get(name) != theirs.get(name):
            say = {pid: "not rewritten" if r is None else f"{r.format} scales k {r.k_scale} v {r.v_scale}"
                   for pid, r in ((a.pid, mine.get(name)), (b.pid, theirs.get(name)))}
            return f"layer {name}: {say[a.pid]} in pid {a.pid}, {say[b.pid]} in pid {b.pid}"
    return f"{_summary(a)}; {_summary(b)}"


def checked_record(records: Sequence[PluginRecord], expected: ExpectedLoads, where: str) -> PluginRecord:
    """The target load every model-loading process recorded (`records`; a pid's last target record counts),
    its pipeline stages' layers merged in layer order; EngineError (one line, prefixed `where`) when none or
    fewer than `expected.processes` arrived, or when they disagree on the spec, vLLM or any layer's format
    and scales (under pipeline parallelism: unless they split into `expected.stages` disjoint sets of
    layers; per-head scales: on a KV head two tensor-parallel ranks both hold, the record returned holding
    every head's). Drafters' records, where there are any, pass the same check among themselves."""
    drafters = [r for r in records if r.role == "drafter"]
    if drafters:
        checked_loads([r for r in records if r.role == "drafter"], expected, f"{where} (speculative drafter)")
    return checked_loads([r for r in records if r.role == "target"], expected, where)


def checked_loads(records: Sequence[PluginRecord], expected: ExpectedLoads, where: str) -> PluginRecord:
    """checked_record for the records of one role."""
    by_pid = {r.pid: r for r in records}
    got = list(by_pid.values())
    if not got:
        raise EngineError(f"{where}: the qa_kv plugin recorded no model load: {NO_RECORD_HINT}; refusing to run "
                          "the arm unemulated")
    if len(got) < expected.processes:
        raise EngineError(f"{where}: the qa_kv plugin recorded {len(got)} model loads (pids "
                          f"{', '.join(str(r.pid) for r in got)}), but {expected.processes} processes load the "
                          f"model (tensor x pipeline x context x data parallel): the others ran without it; "
                          "refusing to run the arm partly unemulated")
    first = got[0]
    for other in got[1:]:
        if other.spec != first.spec or other.vllm != first.vllm:
            raise EngineError(f"{where}: the qa_kv plugin's records disagree: {_difference(first, other)}; "
                              "refusing the arm")
    stages: dict[frozenset[str], list[PluginRecord]] = {}  # layer names -> the processes that rewrote them
    for record in got:
        stages.setdefault(frozenset(r.name for r in record.layers), []).append(record)
    heads = [group[0] for group in stages.values()]
    disjoint = sum(map(len, stages)) == len(frozenset().union(*stages))
    per_stage = expected.processes // expected.stages
    if len(stages) != expected.stages or not disjoint:
        why = (_difference(heads[0], heads[1]) if len(heads) > 1 else
               f"every process rewrote the same {len(first.layers)} layers, where {expected.stages} pipeline "
               "stages split them")
        raise EngineError(f"{where}: the qa_kv plugin's records disagree on the layers: {why}; refusing the arm")
    short = [group for group in stages.values() if len(group) < per_stage]
    if short:
        raise EngineError(f"{where}: the pipeline stage of {_summary(short[0][0])} has {len(short[0])} of its "
                          f"{per_stage} records: the others ran without the qa_kv plugin; refusing the arm")
    joined = [joined_heads(group) for group in stages.values()]  # tensor-parallel ranks' KV heads joined
    for group, whole in zip(stages.values(), joined):
        for other in group:
            if other.layers != [head_share(whole, r) for r in other.layers]:
                raise EngineError(f"{where}: the qa_kv plugin's records disagree: {_difference(group[0], other)}; "
                                  "refusing the arm")
    if expected.stages == 1:
        return joined[0]
    layers = sorted((r for whole in joined for r in whole.layers), key=lambda r: (r.layer, r.name))
    return first.model_copy(update={"layers": layers})


def joined_heads(group: Sequence[PluginRecord]) -> PluginRecord:
    """The first of one pipeline stage's records with each per-head layer's scales joined over the KV heads
    its tensor-parallel ranks hold (`kv_heads`, head order; a replicated head from its first rank)."""
    layers = []
    for layer in group[0].layers:
        k: dict[int, float] = {}
        v: dict[int, float] = {}
        for record in group:
            for r in (r for r in record.layers if r.name == layer.name and r.kv_heads):
                for head, ks, vs in zip(r.kv_heads, r.k_scale, r.v_scale, strict=False):
                    k.setdefault(head, ks)
                    v.setdefault(head, vs)
        heads = sorted(k)
        layers.append(layer.model_copy(update={"kv_heads": heads, "k_scale": [k[h] for h in heads],
                                               "v_scale": [v[h] for h in heads]}) if heads else layer)
    return group[0].model_copy(update={"layers": layers})


def head_share(whole: PluginRecord, layer: RewrittenLayer) -> RewrittenLayer:
    """`whole`'s entry (joined_heads, one stage) for `layer`'s name, cut to the KV heads `layer` holds: what the
    process that recorded `layer` should have recorded (the entry whole when either names no heads)."""
    mine = next(r for r in whole.layers if r.name == layer.name)  # a stage's records name the same layers
    if not mine.kv_heads or not layer.kv_heads:
        return mine
    at = {h: i for i, h in enumerate(mine.kv_heads)}
    heads = layer.kv_heads
    if any(h not in at for h in heads):  # a head without a scale in its own record: never equal
        return mine
    return mine.model_copy(update={"kv_heads": heads, "k_scale": [mine.k_scale[at[h]] for h in heads],
                                   "v_scale": [mine.v_scale[at[h]] for h in heads]})


def scales_identity(spec: KVQuantSpec) -> tuple[ScalesOrigin, str | None, str | None]:
    """(origin, sha256, convention) of the spec's scales: a model folder's scale files and the convention
    it declares, or a scales file's tensors and the convention of the spec's format."""
    if spec.scales == "dynamic":
        return "dynamic", None, None
    if spec.scales == "constant":  # a constant given for a format is that format's own decode scale
        expected = expected_convention(spec.format)
        return "constant", None, expected.name if expected is not None else None
    path = spec.scales_file
    if path is None:
        return "unknown", None, None
    if Path(path).is_dir():
        folder = read_folder_scales(Path(path))
        return "calibrated", folder.sha256(), folder.convention.name
    convention = VLLM_FOLDER_FORMATS[spec.format][0] if spec.format in VLLM_FOLDER_FORMATS else None
    return "calibrated", sha256_file(scales_paths(Path(path))[0]), convention


def emulated_provenance(record: PluginRecord, source: ProvenanceSource) -> KVProvenance:
    """The arm's KV provenance from a plugin record: emulated in vLLM, the spec's format, its scales
    (origin, sha256, convention) and every rewritten layer's format and decode scales."""
    spec = KVQuantSpec.model_validate(record.spec)
    layers = [LayerScales(layer=r.layer, format=r.format, k_scale=r.k_scale, v_scale=r.v_scale,
                          num_kv_heads=r.num_kv_heads, head_size=r.head_size) for r in record.layers]
    quantized = any(r.format != "none" for r in record.layers)
    origin, sha, convention = scales_identity(spec) if quantized else ("unquantized", None, None)
    kinds = sorted({r.kind for r in record.layers})
    return KVProvenance(
        source=source, kv_dtype=spec.format, storage_dtype="model dtype (emulated values)",
        encoding=(f"emulated in vLLM {record.vllm} by the qa_kv plugin: {len(record.layers)} "
                  f"{'/'.join(kinds)} layers rewritten"),
        scales_origin=origin, scales_expected=spec.scales == "static", scales_sha256=sha,
        constant_scale=float(spec.constant_scale) if spec.constant_scale is not None else None,
        scales_convention=convention, layers=layers)
