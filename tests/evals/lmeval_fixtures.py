"""Synthetic lm-eval `--log_samples` output folders, in the exact layout and line format that
lm-eval 0.4.x writes (lm_eval/evaluator.py + loggers/evaluation_tracker.py): results_<date>.json and
samples_<task>_<date>.jsonl under <output_path>/<model_name_sanitized>/, resps and filtered_resps
stringified by sanitize_list, arguments as {"gen_args_i": {"arg_j": ...}}, target as str."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

DATE = "2025-03-04T05-06-07.123456"


def _h(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def mc_lines(correct: Sequence[int], n_choices: int = 4, seed_shift: int = 0, prompt_tag: str = "") -> list[dict]:
    """Multiple-choice (loglikelihood) lines: doc i is right iff correct[i] (gold is choice 0)."""
    lines = []
    for i, right in enumerate(correct):
        doc = {"question": f"question {i}?", "choices": [f"c{j}" for j in range(n_choices)], "answer": 0}
        ctx = f"{prompt_tag}Question: question {i}?\nAnswer:"
        lls = [-1.0 - 0.1 * j - 0.01 * seed_shift for j in range(n_choices)]
        if not right:
            lls[0], lls[1] = lls[1] - 0.5, lls[0]  # make a distractor the best
        best = max(range(n_choices), key=lambda j: lls[j])
        line = {
            "doc_id": i,
            "doc": doc,
            "target": "0",
            "arguments": {f"gen_args_{j}": {"arg_0": ctx, "arg_1": f" c{j}"} for j in range(n_choices)},
            "resps": [[[str(lls[j]), str(j == best)]] for j in range(n_choices)],
            "filtered_resps": [[str(lls[j]), str(j == best)] for j in range(n_choices)],
            "filter": "none",
            "metrics": ["acc", "acc_norm"],
            "doc_hash": _h(json.dumps(doc, indent=2, ensure_ascii=False)),
            "prompt_hash": _h(ctx),
            "target_hash": _h("0"),
            "acc": float(right),
            "acc_norm": float(right),
        }
        lines.append(line)
    return lines


def gen_lines(
    strict: Sequence[int], flexible: Sequence[int], completions: Sequence[str], answers: Sequence[str]
) -> list[dict]:
    """Generative (GSM8K-like) lines: one per (doc, filter) for strict-match and flexible-extract."""
    lines = []
    for filt, scores in (("strict-match", strict), ("flexible-extract", flexible)):
        for i, score in enumerate(scores):
            doc = {"question": f"q{i}", "answer": f"#### {i}"}
            ctx = f"Question: q{i}\nAnswer:"
            lines.append({
                "doc_id": i,
                "doc": doc,
                "target": str(i),
                "arguments": {"gen_args_0": {"arg_0": ctx, "arg_1": {"until": ["Question:"], "do_sample": False}}},
                "resps": [[completions[i]]],
                "filtered_resps": [answers[i] if filt == "flexible-extract" else f"[{answers[i]}]"],
                "filter": filt,
                "metrics": ["exact_match"],
                "doc_hash": _h(json.dumps(doc, indent=2, ensure_ascii=False)),
                "prompt_hash": _h(ctx),
                "target_hash": _h(str(i)),
                "exact_match": float(score),
            })
    return lines


def write_run(folder: Path, tasks: dict[str, list[dict]], *, model: str = "org__tiny", date: str = DATE,
              versions: dict[str, int | float | str] | None = None) -> Path:
    """Write one lm-eval output folder; returns <folder>/<model>."""
    sub = folder / model
    sub.mkdir(parents=True, exist_ok=True)
    results = {
        "results": {t: {"alias": t} for t in tasks},
        "versions": versions if versions is not None else dict.fromkeys(tasks, 1.0),
        "n-shot": dict.fromkeys(tasks, 0),
        "model_name": model.replace("__", "/"),
        "model_name_sanitized": model,
        "date": 0.0,
    }
    (sub / f"results_{date}.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    for task, lines in tasks.items():
        with open(sub / f"samples_{task}_{date}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    return sub
