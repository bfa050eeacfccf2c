"""KV-scale provenance of a vLLM server, read from its log (`<run>/logs/<arm>-server.log`).

A server's workers cannot be asked, so its log is all there is. The messages are vLLM 0.32's own
(the strings below are checked against vLLM's source by tests/evals/engines/vllm/test_introspect.py):

- engine start, `config/vllm.py` VllmConfig.__str__: "... quantization=<method or None>, ...
  kv_cache_dtype=<dtype>, ..." -- the resolved cache dtype and whether a quantization config exists;
- `config/cache.py`: "Using <dtype> data type to store kv cache";
- `quantization/kv_cache.py`: "Using KV cache scaling factor 1.0 for fp8_e4m3" (a quant method found
  no scales, or both were 1.0) and "Checkpoint does not provide a q scaling factor";
- `model_loader/weight_utils.py` / `models/utils.py`: "Found kv_scale in the checkpoint" (the
  deprecated single kv_scale, remapped onto k_scale and duplicated to v_scale).

The origin follows vLLM's loading code: a quantized cache without a quantization config never loads
scales (every layer keeps 1.0, and nothing is logged) -> "defaulted"; the 1.0 warning -> "defaulted";
a quantization config and no such warning -> "checkpoint". llama.cpp's server logs its cache types
("K (q8_0): ... MiB, V (q8_0): ... MiB"); its quantized blocks carry their own scales -> "dynamic".
"""

from __future__ import annotations

import re
from pathlib import Path

from evals.provenance.record import KVProvenance, ScalesOrigin

LOG_DIR = "logs"  # <run>/logs/<arm>-server.log: where `qa run` writes an arm's server log
ENGINE_CONFIG = "with config: "
CONFIG_KV_DTYPE = re.compile(r"\bkv_cache_dtype=([A-Za-z0-9_]+)")
CONFIG_QUANTIZATION = re.compile(r"\bquantization=([A-Za-z0-9_-]+)")
STORE_DTYPE = re.compile(r"Using (\S+) data type to store kv cache")
SCALE_DEFAULTED = "Using KV cache scaling factor 1.0 for fp8_e4m3"
NO_Q_SCALE = "Checkpoint does not provide a q scaling factor"
FUSED_KV_SCALE = "Found kv_scale in the checkpoint"
# llama.cpp's llama_kv_cache: "size = ... MiB (... cells, ... layers, ... seqs), K (q8_0): ... MiB, V (q8_0): ... MiB"
LLAMACPP_TYPES = re.compile(r"K \(([A-Za-z0-9_]+)\): +[0-9.]+ MiB, V \(([A-Za-z0-9_]+)\)")
KV_MESSAGES = (SCALE_DEFAULTED, NO_Q_SCALE, FUSED_KV_SCALE, "data type to store kv cache")
UNQUANTIZED = frozenset({"auto", "bfloat16", "float16", "float32", "half", "float", "f16", "f32", "bf16"})
MAX_LOG_LINES = 8  # the KV lines kept in the manifest (each message is logged once per process)


def server_log_path(run_dir: Path, arm: str) -> Path:
    """`<run_dir>/logs/<arm>-server.log`: where the server `qa run` starts for `arm` writes its log."""
    return Path(run_dir) / LOG_DIR / f"{arm}-server.log"


def _vllm_origin(kv_dtype: str, quantization: str | None, defaulted: bool) -> ScalesOrigin:
    if kv_dtype in UNQUANTIZED:
        return "unquantized"
    if defaulted or quantization in (None, "None"):
        return "defaulted"
    return "checkpoint"


def log_provenance(text: str) -> KVProvenance | None:
    """What a vLLM (or llama.cpp) server's own log messages say about its KV cache; None when they say
    nothing (a qa_kv plugin record in the log is read by evals.engines.kv_provenance.server_provenance)."""
    lines = text.splitlines()
    kept = [line.strip() for line in lines if any(m in line for m in KV_MESSAGES)][:MAX_LOG_LINES]
    config = next((line for line in lines if ENGINE_CONFIG in line and "kv_cache_dtype=" in line), None)
    if config is not None:
        kv = CONFIG_KV_DTYPE.search(config)
        quant = CONFIG_QUANTIZATION.search(config)
        kv_dtype = kv.group(1) if kv else "unknown"
        quantization = quant.group(1) if quant else None
        defaulted = any(SCALE_DEFAULTED in line for line in lines)
        origin = _vllm_origin(kv_dtype, quantization, defaulted) if kv else "unknown"
        expected = origin != "unquantized" and quantization not in (None, "None")
        return KVProvenance(source="vllm-server", kv_dtype=kv_dtype, scales_origin=origin,
                            scales_expected=expected, log_lines=kept)
    found = next((m for line in lines if (m := LLAMACPP_TYPES.search(line))), None)
    if found is not None:
        k, v = found.groups()
        origin: ScalesOrigin = "unquantized" if {k, v} <= UNQUANTIZED else "dynamic"
        return KVProvenance(source="llamacpp-server", kv_dtype=k if k == v else f"k {k}, v {v}",
                            scales_origin=origin, log_lines=[found.string.strip()])
    return None
