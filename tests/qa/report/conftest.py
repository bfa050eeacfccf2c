"""A real kv-inspect report of the tiny Llama (layer 0 NVFP4, layer 1 skipped: exact) for the report tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quant.kv.inspect import InspectReport, inspect_kv, save_inspect
from quant.kv.spec import KVQuantSpec

PROMPTS, TOKENS = 2, 24


@pytest.fixture(scope="session")
def inspect_report(llama) -> InspectReport:
    """quant.kv.inspect.inspect_kv on 2 seeded random prompts of 24 tokens."""
    prompts = torch.randint(1, 128, (PROMPTS, TOKENS), generator=torch.Generator().manual_seed(0))
    return inspect_kv(llama, prompts, KVQuantSpec(format="nvfp4", skip_layers=(1,)), model_name="tiny-llama")


def write_kv(run: Path, report: InspectReport) -> Path:
    """Save `report` as the run's kv_inspect.json with quant.kv.inspect.save_inspect."""
    return save_inspect(run / "kv_inspect.json", report)
