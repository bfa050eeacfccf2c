"""Generative records with truncation and output lengths, and their real comparison (qa.compare.arms), for
the statistics, gate and report tests of truncation."""

from __future__ import annotations

from collections.abc import Sequence

from evals.records.samples import SampleRecord
from qa.compare.arms import Arm, compare_arms
from qa.files.comparison import Comparison, StatsSettings

STRICT, FLEXIBLE = "exact_match,strict-match", "exact_match,flexible-extract"


def gen_records(arm: str, truncated: Sequence[Sequence[bool | None]], *, tokens: Sequence[Sequence[int | None]] | None = None,
                correct: Sequence[float] | None = None, task: str = "gsm8k_cot_llama") -> list[SampleRecord]:
    """One generation record per (item i, repeat r): truncated[i][r] (None: not recorded), output tokens
    tokens[i][r] (default 64, or 256 = max_tokens when truncated), both filters scoring correct[i] (default
    1 on even items, 0 on odd ones, so accuracy has spread)."""
    out = []
    for i, row in enumerate(truncated):
        for r, tr in enumerate(row):
            n_tok = tokens[i][r] if tokens is not None else (256 if tr else 64)
            score = correct[i] if correct is not None else float(i % 2 == 0)
            out.append(SampleRecord(
                task=task, task_version="4.0", arm=arm, item_id=f"doc{i}", repeat=r, prompt_hash=f"{i:064d}",
                target="42", completion="The final answer is 42" if score else "The final answer is 7",
                extracted={"strict-match": "42" if score else "7", "flexible-extract": "42" if score else "7"},
                scores={STRICT: score, FLEXIBLE: score}, output_tokens=n_tok,
                finish_reason="length" if tr else "stop", truncated=tr,
            ))
    return out


def flags(n: int, truncated_items: Sequence[int], repeats: int = 1) -> list[list[bool]]:
    """(n, repeats) truncation flags: every repeat of the listed items truncated, nothing else."""
    hit = set(truncated_items)
    return [[i in hit] * repeats for i in range(n)]


def gen_comparison(base: list[SampleRecord], cand: list[SampleRecord]) -> Comparison:
    """The real comparison of two record lists (no bootstrap)."""
    return compare_arms(Arm("baseline", "records", tuple(base)), Arm("candidate", "records", tuple(cand)),
                        StatsSettings(bootstrap_n=0))
