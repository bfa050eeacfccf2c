"""Calibration and KV-inspection inputs shared by `qa calibrate`, `qa kv-inspect` and `qa run`:
calibration text (wikitext2 test, gsm8k train, or a .txt / .jsonl file), token chunks, the
model-level calibrate call, and the vLLM model folder that carries calibrated scales."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from evals.errors import DataError, ModelError
from evals.models import load_model, resolve_model
from quant.calibrate import CalibrationSpec, calibrate, token_chunks, tokenize_texts
from quant.scales import KVScales

if TYPE_CHECKING:
    from qa.files.rundir import RunDir
    from qa.files.spec import RunSpec

CALIBRATION_SETS = ("wikitext2", "gsm8k")  # named sets; anything else is a .txt / .jsonl path


def calibration_texts(source: str, data_dir: Path | None) -> tuple[str, list[str]]:
    """(data name, texts) of a calibration source: a named set or a .txt / .jsonl file."""
    from evals import data

    if source == "wikitext2":
        return source, [r["text"] for r in data.load("wikitext2", data.resolve_data_dir(data_dir))]
    if source == "gsm8k":
        rows = data.load("gsm8k", data.resolve_data_dir(data_dir), split="train")
        return "gsm8k-train", [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in rows]
    path = Path(source)
    if not path.is_file():
        raise DataError(f"calibration data {source!r}: not {' or '.join(CALIBRATION_SETS)} and not a file")
    if path.suffix == ".jsonl":
        texts = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise DataError(f"{path}:{n}: expected a JSON object with a string field 'text'")
                texts.append(row["text"])
        return path.name, texts
    return path.name, [path.read_text(encoding="utf-8")]


def load_prompts(tokenizer: Any, source: str, data_dir: Path | None, n: int, seq_len: int,
                 seed: int) -> tuple[str, torch.Tensor]:
    """(data name, token chunks [n, seq_len]) from a calibration source."""
    name, texts = calibration_texts(source, data_dir)
    return name, token_chunks(tokenize_texts(tokenizer, texts), n, seq_len, seed)


def calibrate_model(model_name: str, source: str, spec: CalibrationSpec, data_dir: Path | None = None,
                    device: str = "cpu", dtype: str = "float32", trust_remote_code: bool = False) -> KVScales:
    """Load the model and the calibration text, and calibrate static KV scales."""
    model, tokenizer = load_model(resolve_model(model_name), dtype=dtype, device=device,
                                  trust_remote_code=trust_remote_code)
    name, chunks = load_prompts(tokenizer, source, data_dir, spec.n_samples, spec.seq_len, spec.seed)
    return calibrate(model, chunks, spec, data_name=name, model_name=model_name)


def export_vllm_model(model_name: str, scales: KVScales, out_dir: Path) -> list[Path]:
    """Write a model folder vLLM loads with `scales` as its FP8 KV scales (quant.export.export_model_folder)."""
    from quant.export import export_model_folder

    resolved = resolve_model(model_name)
    if resolved.path is None:
        raise ModelError(f"model {model_name!r} has no local folder to export from")
    return export_model_folder(scales, resolved.path, out_dir)


VLLM_FP8_DTYPES = ("fp8", "fp8_e4m3")  # vLLM KV dtypes that store E4M3 and read per-layer k/v scales


def feeds_vllm(spec: RunSpec, role: str) -> bool:
    """Whether the spec's [calibration] feeds arm `role` as a vLLM model folder: a vllm candidate with an
    FP8 (E4M3) KV cache and no model of its own, in a spec that calibrates fp8_e4m3 scales."""
    from evals.engines.vllm_args import VllmEngineArgs

    arm = spec.arms[role]
    if spec.calibration is None or spec.calibration.format != "fp8_e4m3" or role not in spec.candidates:
        return False
    args = arm.engine_args
    return (arm.engine == "vllm" and arm.model is None and isinstance(args, VllmEngineArgs)
            and str(args.flags().get("kv_cache_dtype", "auto")) in VLLM_FP8_DTYPES)


def calibrated_vllm_model(spec: RunSpec, role: str, rd: RunDir) -> str | None:
    """The model folder (RunDir.vllm_model) that carries the run's calibrated scales to a vllm arm the
    calibration feeds, written from the scales file on first use; None for any other arm."""
    if not feeds_vllm(spec, role):
        return None
    folder = rd.vllm_model
    if not (folder / "config.json").is_file():
        export_vllm_model(spec.arm_model(role), KVScales.load(rd.scales), folder)
    return str(folder)
