"""The gate: the one function that decides a comparison, used by `qa gate`, `qa report`, `qa run`, `qa compare
--policy` and the API alike.

`decide` applies every rule: the accuracy and truncation rules of qa.gate.rules, the reference-answer rules of
qa.gate.reference, the cache-path rules of qa.gate.cache_path and the sequential looks of qa.gate.sequential, on
comparison.json's numbers, then the KV-scale provenance rule (qa.gate.provenance) on what the
candidate's engine said it ran with (records/<candidate>/arm.json). `decide_folder` reads both from a run
directory, leaves the verdict inconclusive where an arm's proof of execution refused it, and applies the
batch-invariance rules where the folder holds batch_invariance.json (qa.gate.batch_invariance).
"""

from __future__ import annotations

from evals.provenance.record import KVProvenance
from qa.compare.batch_invariance import INVARIANCE_FILE, BatchInvariance
from qa.files.comparison import Comparison
from qa.files.policy import Policy
from qa.files.rundir import RunDir
from qa.files.verdict import Verdict
from qa.gate.batch_invariance import apply_invariance, decide_invariance
from qa.gate.provenance import (
    apply_execution_rule,
    apply_scales_rule,
    check_scales,
    execution_refusal,
    load_kv_provenance,
)
from qa.gate.rules import apply_rules


def decide(comparison: Comparison, policy: Policy, kv: KVProvenance | None,
           comparison_sha256: str | None = None) -> Verdict:
    """The verdict on `comparison` under `policy`, the candidate having run with KV provenance `kv` (None:
    not recorded, not judged); writes nothing."""
    verdict = apply_rules(comparison, policy, comparison_sha256)
    return apply_scales_rule(verdict, check_scales(verdict.candidate, kv), policy)


def decide_folder(rd: RunDir, policy: Policy, comparison: Comparison | None = None) -> Verdict:
    """`decide` on a run directory's comparison.json (or `comparison`, read from it) and the candidate's
    arm.json; the verdict names the comparison's sha256. Writes nothing."""
    comparison = comparison or rd.load_comparison()
    kv = load_kv_provenance(rd.arm_records(comparison.candidate))
    refusals = [r for arm in (comparison.baseline, comparison.candidate)
                if (r := execution_refusal(arm, rd.arm_records(arm))) is not None]
    verdict = apply_execution_rule(decide(comparison, policy, kv, rd.comparison_sha256()), refusals)
    if (rd.root / INVARIANCE_FILE).is_file():
        verdict = apply_invariance(verdict, decide_invariance(BatchInvariance.load(rd.root / INVARIANCE_FILE), policy))
    return verdict
