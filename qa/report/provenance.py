"""The report's "KV cache and scales that ran" section: per arm, the KV dtype its engine resolved, the
stored dtype, where the K/V scales came from and their per-layer values (records/<arm>/arm.json
`engine_info.kv`), and the scales rule's finding for the candidate (qa.gate.provenance)."""

from __future__ import annotations

from evals.errors import RecordError
from evals.provenance.record import KVProvenance
from qa.files.rundir import RunDir
from qa.gate.provenance import FAILING, check_scales, load_kv_provenance
from qa.report.document import Block, Code, Paragraph, Section, bullets, line, table
from qa.report.gather import ReportInputs
from qa.report.rows import memory_line

TITLE = "KV cache and scales that ran"
HEADERS = ("arm", "engine said", "KV dtype", "stored as", "scales", "k_scale per layer", "v_scale per layer")
MAX_LAYERS_SHOWN = 64  # per-layer lists longer than this are shown as min..max


def arm_provenance(inp: ReportInputs) -> dict[str, KVProvenance]:
    """arm name -> the provenance its arm.json recorded (arms without one are left out)."""
    rd = RunDir(inp.run_dir)
    out: dict[str, KVProvenance] = {}
    for arm in dict.fromkeys([inp.comparison.baseline, inp.comparison.candidate]):
        try:
            kv = load_kv_provenance(rd.arm_records(arm))
        except RecordError:
            continue
        if kv is not None:
            out[arm] = kv
    return out


def _values(layers: list[list[float]]) -> str:
    flat = [x for per in layers for x in per]
    if not flat:
        return "-"
    if len(layers) > MAX_LAYERS_SHOWN or any(len(per) > 1 for per in layers):
        return f"{min(flat):.4g}..{max(flat):.4g}"
    return " ".join(f"{x:.4g}" for x in flat)


def provenance_rows(provs: dict[str, KVProvenance]) -> list[list[str]]:
    """One row per arm (HEADERS), plain text."""
    rows = []
    for arm, kv in provs.items():
        origin = kv.scales_origin + (f" (sha256 {kv.scales_sha256[:12]})" if kv.scales_sha256 else "")
        if kv.constant_scale is not None:
            origin += f" {kv.constant_scale:g}"
        stored = ", ".join(x for x in (kv.storage_dtype, kv.encoding) if x) or "-"
        rows.append([arm, kv.source, kv.kv_dtype, stored, origin,
                     _values([s.k_scale for s in kv.layers]), _values([s.v_scale for s in kv.layers])])
    return rows


def finding(inp: ReportInputs, provs: dict[str, KVProvenance]) -> str | None:
    """The scales rule's one-line finding for the candidate (None when it has no provenance)."""
    kv = provs.get(inp.comparison.candidate)
    if kv is None:
        return None
    check = check_scales(inp.comparison.candidate, kv)
    if check.finding in FAILING:
        how = "fails the gate" if inp.verdict.policy.require_scales else "a warning (require_scales = false)"
        return f"{check.message}: {how}"
    return check.message


def section(inp: ReportInputs) -> Section | None:
    """The section: one row per arm, the scales rule's finding and the server's log lines (None when no arm
    recorded provenance)."""
    provs = arm_provenance(inp)
    if not provs:
        return None
    blocks: list[Block] = [table(HEADERS, provenance_rows(provs))]
    note = finding(inp, provs)
    if note is not None:
        blocks.append(Paragraph(line("Scales check: ", note)))
    cand = provs.get(inp.comparison.candidate)
    memory = memory_line(cand.bytes_per_token(), [s.format for s in cand.layers]) if cand is not None else None
    if memory is not None:
        blocks.append(Paragraph(line(f"{inp.comparison.candidate}: ", memory)))
    logged = [line(arm, " server log: ", Code(text)) for arm, kv in provs.items() for text in kv.log_lines]
    if logged:
        blocks.append(bullets(logged))
    return Section(TITLE, tuple(blocks))
