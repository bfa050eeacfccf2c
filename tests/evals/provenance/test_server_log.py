"""Server logs as KV-scale provenance: vLLM's engine-config line and scale messages, llama.cpp's cache
line; the origin follows vLLM's loading rules (no quantization config: scales never loaded)."""

from __future__ import annotations

import pytest

from evals.provenance.server_log import SCALE_DEFAULTED, log_provenance

CONFIG_LINE = ("(APIServer pid=7) INFO 12-01 13:50:39 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with "
               "config: model='/models/m', dtype=torch.bfloat16, max_seq_len=256, quantization={q}, "
               "quantization_config=None, enforce_eager=True, kv_cache_dtype={kv}, device_config=cpu, seed=0")
STORE_LINE = ("(APIServer pid=7) INFO 12-01 13:50:37 [cache.py:361] Using fp8 data type to store kv cache. It "
              "reduces the GPU memory footprint and boosts the performance.")
DEFAULTED_LINE = f"(EngineCore pid=9) WARNING 12-01 13:50:41 [kv_cache.py:139] {SCALE_DEFAULTED}. If this is unintended"
LLAMACPP_LINE = ("llama_kv_cache: size = 12.00 MiB (  4096 cells,  30 layers,  1/1 seqs), K (q8_0):   6.00 MiB, "
                 "V (q8_0):   6.00 MiB")


@pytest.mark.parametrize(("lines", "origin", "expected"), [
    ([STORE_LINE, CONFIG_LINE.format(q="None", kv="fp8")], "defaulted", False),
    ([CONFIG_LINE.format(q="compressed-tensors", kv="fp8")], "checkpoint", True),
    ([CONFIG_LINE.format(q="compressed-tensors", kv="fp8"), DEFAULTED_LINE], "defaulted", True),
    ([CONFIG_LINE.format(q="None", kv="auto")], "unquantized", False),
])
def test_vllm_server_log(lines: list[str], origin: str, expected: bool) -> None:
    prov = log_provenance("\n".join(["(APIServer pid=7) INFO starting", *lines, "INFO done"]))
    assert prov is not None and prov.source == "vllm-server"
    assert (prov.scales_origin, prov.scales_expected) == (origin, expected)
    assert all("with config" not in line for line in prov.log_lines)  # the long config line is not kept
    assert (DEFAULTED_LINE.strip() in prov.log_lines) == (DEFAULTED_LINE in lines)


def test_llamacpp_and_silent_logs() -> None:
    prov = log_provenance(f"srv load\n{LLAMACPP_LINE}\n")
    assert prov is not None and (prov.source, prov.kv_dtype, prov.scales_origin) == ("llamacpp-server", "q8_0", "dynamic")
    f16 = log_provenance(LLAMACPP_LINE.replace("q8_0", "f16"))
    assert f16 is not None and f16.scales_origin == "unquantized"
    assert log_provenance("nothing about the cache here\n") is None
