"""Calibration and KV-inspection inputs shared by `qa calibrate`, `qa kv-inspect` and `qa run`'s worker:
calibration text (wikitext2 test, gsm8k train, or a .txt / .jsonl file), token chunks, the model-level
calibrate call, and the vLLM model folder that carries calibrated scales. Torch code: the CLI and the
worker import it when they calibrate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from evals import data
from evals.errors import DataError, ModelError
from evals.models.load import load_model
from evals.models.resolve import ResolvedModel, resolve_model
from quant.fileio import jsonl_objects
from quant.kv.calibrate import CalibrationSpec, calibrate, token_chunks, tokenize_texts
from quant.scales.export import export_model_folder
from quant.scales.files import KVScales

CALIBRATION_SETS = ("wikitext2", "gsm8k")  # named sets; anything else is a .txt / .jsonl path


def calibration_texts(source: str, data_dir: Path | None) -> tuple[str, list[str]]:
    """(data name, texts) of a calibration source: a named set or a .txt / .jsonl file."""
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
        shape = "expected a JSON object with a string field 'text'"
        with open(path, encoding="utf-8") as fh:
            for n, row in jsonl_objects(fh, path, DataError, corrupt=shape, expected=shape, keys=("text",)):
                if not isinstance(row["text"], str):
                    raise DataError(f"{path}:{n}: {shape}")
                texts.append(row["text"])
        return path.name, texts
    return path.name, [path.read_text(encoding="utf-8")]


def load_prompts(tokenizer: Any, source: str, data_dir: Path | None, n: int, seq_len: int,
                 seed: int) -> tuple[str, torch.Tensor]:
    """(data name, token chunks [n, seq_len]) from a calibration source."""
    name, texts = calibration_texts(source, data_dir)
    return name, token_chunks(tokenize_texts(tokenizer, texts), n, seq_len, seed)


def calibrate_model(model: str | ResolvedModel, source: str, spec: CalibrationSpec, data_dir: Path | None = None,
                    device: str = "cpu", dtype: str = "float32", trust_remote_code: bool = False) -> KVScales:
    """Load the model (a name is resolved here) and the calibration text, and calibrate static KV scales."""
    resolved = resolve_model(model) if isinstance(model, str) else model
    loaded, tokenizer = load_model(resolved, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
    name, chunks = load_prompts(tokenizer, source, data_dir, spec.n_samples, spec.seq_len, spec.seed)
    return calibrate(loaded, chunks, spec, data_name=name, model_name=resolved.name)


def export_vllm_model(model: str | ResolvedModel, scales: KVScales, out_dir: Path) -> list[Path]:
    """Write a model folder vLLM loads with `scales` as its FP8 KV scales (quant.scales.export.export_model_folder);
    a model given by name is resolved here."""
    resolved = resolve_model(model) if isinstance(model, str) else model
    if resolved.path is None:
        raise ModelError(f"model {resolved.name!r} has no local folder to export from")
    return export_model_folder(scales, resolved.path, out_dir)
