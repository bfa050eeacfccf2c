"""The KV-scale provenance rule: a candidate meant to run with measured K/V scales must have run with them.

An arm is *meant* to use measured scales when its provenance says so (`scales_expected`: an emulated
cache with static scales, a vLLM model folder whose config declares a kv_cache_scheme, a vLLM server
with a quantization config). When such a candidate ran with scales that defaulted to 1.0 (or the
engine could not say where they came from), the policy's `require_scales` decides: true -> the
verdict fails; false (the default) -> a warning in the verdict's summary. The same holds for a
candidate whose KV cache is NVFP4 and ran with every K/V scale 1.0, asked for or not (vLLM's default is
unusable for NVFP4), and for one whose scales are in another convention than its cache reads them in
(`mismatch`: e.g. NVFP4 decode scales amax/2688 run by an fp8 cache, or a global scale amax/6 read as
vLLM's NVFP4 decode multiplier). A quantized candidate nobody promised scales for that ran at 1.0 gets a
note only. The provenance is read from the arm's records/<arm>/arm.json (`engine_info.kv`); arms
without one (lm-eval imports) are not judged. An arm whose vLLM KV plugin's proof of execution refused it
(`engine_info.kv_execution.refusal`) leaves the verdict inconclusive, whatever its records say.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from evals.errors import RecordError
from evals.provenance.record import STATIC_ORIGINS, KVProvenance
from evals.records.arm_file import ARM_FILE, ArmManifest, EngineSummary
from qa.files.policy import Policy
from qa.files.verdict import Verdict

Finding = Literal["ok", "missing", "mismatch", "defaulted_unasked", "not_judged"]
FAILING: frozenset[str] = frozenset({"missing", "mismatch"})  # findings `require_scales` fails


@dataclass(frozen=True)
class ScalesCheck:
    """What the rule found for one candidate, with the one-line message the verdict carries."""

    finding: Finding
    message: str


def load_kv_provenance(arm_dir: Path) -> KVProvenance | None:
    """The `engine_info.kv` of records/<arm>/arm.json; None when the arm has no manifest, an unreadable one
    (lm-eval imports, hand-made folders: not judged) or no provenance."""
    info = engine_info(arm_dir)
    return info.kv if info is not None else None


def engine_info(arm_dir: Path) -> EngineSummary | None:
    """The `engine_info` of records/<arm>/arm.json; None when the arm has no manifest or an unreadable one."""
    path = arm_dir / ARM_FILE
    if not path.is_file():
        return None
    try:
        return ArmManifest.load(path).engine_info
    except RecordError:
        return None


def check_scales(arm: str, kv: KVProvenance | None) -> ScalesCheck:
    """Judge one candidate's provenance (see the module docstring)."""
    if kv is None:
        return ScalesCheck("not_judged", f"{arm}: no KV-scale provenance recorded")
    if kv.scales_expected and kv.scales_origin not in STATIC_ORIGINS:
        return ScalesCheck("missing", f"candidate {arm!r} was meant to run with calibrated K/V scales but ran with "
                                      f"scales {kv.scales_origin} ({kv.summary()})")
    if kv.quantized and kv.nvfp4() and kv.unit_scales():
        return ScalesCheck("missing", f"candidate {arm!r} asked for an NVFP4 KV cache but ran with every K/V scale "
                                      f"1.0 (uncalibrated; {kv.summary()})")
    mismatch = kv.convention_mismatch()
    if mismatch is not None:
        return ScalesCheck("mismatch", f"candidate {arm!r} ran with K/V scales in a mismatched convention: "
                                       f"{mismatch} ({kv.summary()})")
    if kv.quantized and kv.scales_origin == "defaulted":
        return ScalesCheck("defaulted_unasked", f"candidate {arm!r} ran its {kv.kv_dtype} KV cache with K/V scales "
                                                "defaulted to 1.0 (no calibrated scales were asked for)")
    return ScalesCheck("ok", f"{arm}: {kv.summary()}")


def execution_refusal(arm: str, arm_dir: Path) -> str | None:
    """Why arm `arm` did not run what it claims (records/<arm>/arm.json `engine_info.kv_execution.refusal`: the
    vLLM plugin's rewrite counts did not match the tokens vLLM computed), None when nothing refused it."""
    info = engine_info(arm_dir)
    refusal = None if info is None or info.kv_execution is None else info.kv_execution.refusal
    return None if refusal is None else f"arm {arm!r} was refused after it ran: {refusal}"


def apply_execution_rule(verdict: Verdict, refusals: list[str]) -> Verdict:
    """The verdict inconclusive (unless it already fails) when an arm's emulation did not run over every token
    it served: its records do not stand for the configuration it names."""
    if not refusals:
        return verdict
    status = "fail" if verdict.status == "fail" else "inconclusive"
    return verdict.model_copy(update={"status": status,
                                      "summary": f"{status.upper()}: {'; '.join(refusals)}; {verdict.summary}"})


def apply_scales_rule(verdict: Verdict, check: ScalesCheck, policy: Policy) -> Verdict:
    """The verdict with the rule applied: a failure under `require_scales`, else a warning in the summary."""
    if check.finding in FAILING and policy.require_scales:
        return verdict.model_copy(update={"status": "fail",
                                          "summary": f"FAIL: {check.message} (require_scales); {verdict.summary}"})
    if check.finding in (*FAILING, "defaulted_unasked"):
        return verdict.model_copy(update={"summary": f"{verdict.summary}; warning: {check.message}"})
    return verdict
