"""One interface for every KV-cache format, looked up by name: `get_format("nvfp4").quantize(x, scale)`.

A `KVFormat` quantizes a tensor [..., D] (D = head_dim) into a `QuantizedTensor` holding the bytes a
kernel would store, and dequantizes it back. Scales passed in are always DECODE scales d (checkpoint
`k_scale` / `v_scale` convention: x ~ stored * d): d = amax / (448 * 6) for NVFP4, amax / fp8_max for
FP8. NVFP4 turns d into the kernel's encode scale gs = fl32(1/d), as vLLM's KV store does, so a
dynamic NVFP4 quantization here uses d = fl32(amax / 2688) and gs = fl32(1/d) (nvfp4.quantize's own
dynamic mode uses gs = fl32(2688 * fl32(1/amax)) directly; the two can differ in the last bit of gs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from quant.errors import QuantError
from quant.formats import compiled, fp8, fp8_fused, intq, mxfp4, nvfp4, nvfp4_fused, turboquant
from quant.formats.catalog import FORMAT_NAMES as KV_FORMAT_NAMES
from quant.formats.catalog import unknown_format
from quant.formats.fp8 import FP8Kind, FP8Rounding
from quant.formats.intq import IntBits
from quant.formats.quantized import QuantizedTensor
from quant.formats.turboquant import TurboQuantFormat
from quant.formats.ultraquant import UltraQuantFormat
from quant.formats.vllm_per_token_head import Int4PerTokenHeadFormat, PerTokenHeadFormat

# bits per element at head_dim 128 (per-row float32 scales of INT formats amortized over 128 elements)
REFERENCE_HEAD_DIM = 128
NVFP4_BITS = 4 + 8 / nvfp4.BLOCK_SIZE  # 4.5: E2M1 + one E4M3 byte per 16 elements
MXFP4_BITS = 4 + 8 / mxfp4.BLOCK_SIZE  # 4.25: E2M1 + one E8M0 byte per 32 elements
# NVFP4's decode scale range: keeps gs = 1/d within [nvfp4.MIN_GLOBAL_SCALE, nvfp4.MAX_GLOBAL_SCALE]
NVFP4_MIN_DECODE_SCALE = 1.0 / nvfp4.MAX_GLOBAL_SCALE
NVFP4_MAX_DECODE_SCALE = 1.0 / nvfp4.MIN_GLOBAL_SCALE



class KVFormat(Protocol):
    """A KV-cache number format: quantize [..., D] tensors, dequantize them, report their size."""

    name: str
    bits_per_element: float  # stored bits per element at head_dim 128, per-tensor scales excluded
    needs_tensor_scale: bool  # True when a per-tensor/per-head decode scale applies

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """Quantize x [..., D] with decode scale `scale` (shape () or broadcastable to x[..., :1]); None = dynamic."""
        ...

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Values of q, shape q.shape, in `dtype`."""
        ...

    def decode_scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """Decode scale (float32) that maps `amax` to the format's largest value."""
        ...


def _check_format(fmt: KVFormat, q: QuantizedTensor) -> None:
    if q.format != fmt.name:
        raise QuantError(f"cannot dequantize a {q.format!r} tensor with format {fmt.name!r}")


def _decode_scale(x: torch.Tensor, scale: torch.Tensor | float | None, fmt: KVFormat) -> torch.Tensor:
    """The decode scale to use: `scale` checked against x [..., D], or the dynamic one from amax(|x|)."""
    if scale is None:
        amax = x.detach().abs().amax()
        if not bool(torch.isfinite(amax)):
            raise QuantError(f"{fmt.name} input holds NaN or Inf: a KV cache with non-finite values is a model bug")
        return fmt.decode_scale_from_amax(amax)
    d = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    target = (*x.shape[:-1], 1)
    ok = d.dim() <= len(target) and all(n in (1, t) for n, t in zip(reversed(d.shape), reversed(target)))
    if not ok:
        raise QuantError(
            f"{fmt.name} scale of shape {tuple(d.shape)} does not broadcast to x[..., :1] {target}; "
            "give a scalar or one value per head, e.g. [1, H, 1, 1]"
        )
    return d


@dataclass(frozen=True)
class NoFormat:
    """`none`: the tensor stored unchanged in its own dtype (the unquantized baseline)."""

    name: str = "none"
    bits_per_element: float = 16.0  # a bf16/fp16 KV cache; nbytes() reports the real dtype
    needs_tensor_scale: bool = False

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """Store x as it is (scale ignored)."""
        return QuantizedTensor(self.name, tuple(x.shape), {"values": x}, None)

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The stored tensor cast to `dtype` (bit-exact when dtype is the stored dtype)."""
        _check_format(self, q)
        return q.data["values"].to(dtype)

    def decode_scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """1.0: nothing is scaled."""
        return torch.ones_like(amax, dtype=torch.float32)


@dataclass(frozen=True)
class NVFP4Format:
    """`nvfp4` (kernel order, bit-exact with FlashInfer/vLLM) and `nvfp4_4over6` (adaptive block scale)."""

    name: str = "nvfp4"
    four_over_six: bool = False
    fused: bool = False  # use the torch.compile'd kernel path (bit-identical; compiles on first call)
    bits_per_element: float = NVFP4_BITS
    needs_tensor_scale: bool = True

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """NVFP4 with gs = fl32(1/d) per tensor or per head; D % 16 == 0."""
        d = _decode_scale(x, scale, self)
        if self.four_over_six:
            t = nvfp4.quantize_4over6(x, decode_scale=d)
        elif self.fused:
            t = nvfp4_fused.quantize(x, decode_scale=d)
        else:
            t = nvfp4.quantize(x, decode_scale=d)
        return QuantizedTensor(self.name, tuple(x.shape), {"packed": t.packed, "scales": t.scales}, d)

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Kernel-order dequantization (code * s) * (1/gs) with gs = fl32(1/d)."""
        _check_format(self, q)
        assert q.scale is not None, "NVFP4 QuantizedTensor without its decode scale"
        gs = nvfp4.global_scale_from_decode_scale(q.scale)
        t = nvfp4.NVFP4Tensor(packed=q.data["packed"], scales=q.data["scales"], global_scale=gs)
        return nvfp4_fused.dequantize(t, dtype) if self.fused else nvfp4.dequantize(t, dtype)

    def compiled_roundtrip(
        self, x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype
    ) -> tuple[QuantizedTensor, torch.Tensor] | None:
        """`quantize(x, scale)` and its values in `dtype` from one compiled loop (kernel recipe,
        `nvfp4_fused.roundtrip`: same bytes and values); None when that path cannot run."""
        if self.four_over_six:
            return None
        d = _decode_scale(x, scale, self)
        both = nvfp4_fused.roundtrip(x, d, dtype)
        if both is None:
            return None
        t, values = both
        return QuantizedTensor(self.name, tuple(x.shape), {"packed": t.packed, "scales": t.scales}, d), values

    def decode_scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """d = amax / 2688 (448 * 6), clamped to [2**-64, 2**114]; 1.0 where amax == 0."""
        amax = amax.to(torch.float32)
        d = (amax / nvfp4.NVFP4_AMAX).clamp(min=NVFP4_MIN_DECODE_SCALE, max=NVFP4_MAX_DECODE_SCALE)
        return torch.where(amax > 0, d, 1.0)


@dataclass(frozen=True)
class MXFP4Format:
    """`qa_mxfp4`: OCP MX E2M1 with a power-of-two E8M0 scale per 32 elements; no tensor scale (the toolkit's own: no
    vLLM KV format)."""

    name: str = "qa_mxfp4"
    bits_per_element: float = MXFP4_BITS
    needs_tensor_scale: bool = False

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """MXFP4 of x [..., D], D % 32 == 0 (scale ignored: self-scaled per block)."""
        t = mxfp4.quantize(x)
        return QuantizedTensor(self.name, tuple(x.shape), {"packed": t.packed, "scales": t.scales}, None)

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """E2M1 value * 2**(byte - 127)."""
        _check_format(self, q)
        return mxfp4.dequantize(mxfp4.MXFP4Tensor(packed=q.data["packed"], scales=q.data["scales"]), dtype)

    def decode_scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """1.0: MXFP4 has no tensor-level scale."""
        return torch.ones_like(amax, dtype=torch.float32)


@dataclass(frozen=True)
class FP8Format:
    """`fp8_e4m3` / `fp8_e5m2`: q = fp8(x / d), saturating, with d per tensor or per head; `rounding`
    "toward_zero" is vLLM-CPU's truncating write (engine profile "vllm-cpu")."""

    name: str
    kind: FP8Kind
    bits_per_element: float = 8.0
    needs_tensor_scale: bool = True
    rounding: FP8Rounding = "nearest"

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """FP8 of x / d; dynamic d = amax / fp8_max."""
        d = _decode_scale(x, scale, self)
        codes = fp8.quantize(x, d, self.kind, self.rounding)
        return QuantizedTensor(self.name, tuple(x.shape), {"values": codes}, d)

    def compiled_roundtrip(
        self, x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype
    ) -> tuple[QuantizedTensor, torch.Tensor] | None:
        """`quantize(x, scale)` and its values in `dtype` from one compiled loop (`fp8_fused.roundtrip`:
        same bytes and values); None when that path cannot run (the truncating write is eager only)."""
        if self.rounding != "nearest":
            return None
        d = _decode_scale(x, scale, self)
        both = fp8_fused.roundtrip(x, d, self.kind, dtype)
        return None if both is None else (QuantizedTensor(self.name, tuple(x.shape), {"values": both[0]}, d), both[1])

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """float(q) * d."""
        _check_format(self, q)
        assert q.scale is not None, "FP8 QuantizedTensor without its decode scale"
        return fp8.dequantize(q.data["values"], q.scale, dtype)

    def decode_scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """d = amax / fp8_max (448 or 57344); 1.0 where amax == 0."""
        return fp8.decode_scale_from_amax(amax, self.kind)


@dataclass(frozen=True)
class IntFormat:
    """`qa_int8` / `qa_int4`: the toolkit's own symmetric INT formats, one float32 scale per (token, head) row,
    round half to even; NOT vLLM's `int8_per_token_head` / `int4_per_token_head` (vllm_per_token_head)."""

    name: str
    bits: IntBits
    bits_per_element: float
    needs_tensor_scale: bool = False

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """Per-row symmetric integer codes of x [..., D] (scale ignored: self-scaled per row)."""
        t = intq.quantize(x, self.bits)
        key = "packed" if self.bits == 4 else "codes"
        return QuantizedTensor(self.name, tuple(x.shape), {key: t.codes, "scales": t.scales}, None)

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """code * row scale."""
        _check_format(self, q)
        codes = q.data["packed"] if self.bits == 4 else q.data["codes"]
        return intq.dequantize(intq.IntTensor(codes=codes, scales=q.data["scales"], bits=self.bits), dtype)

    def decode_scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """amax / qmax (127 or 7): the per-row scale this format computes itself."""
        return amax.to(torch.float32) / intq.qmax(self.bits)


FORMATS: dict[str, KVFormat] = {
    "none": NoFormat(),
    "nvfp4": NVFP4Format(),
    "nvfp4_4over6": NVFP4Format(name="nvfp4_4over6", four_over_six=True),
    "qa_mxfp4": MXFP4Format(),
    "fp8_e4m3": FP8Format(name="fp8_e4m3", kind="e4m3"),
    "fp8_e5m2": FP8Format(name="fp8_e5m2", kind="e5m2"),
    "qa_int8": IntFormat(name="qa_int8", bits=8, bits_per_element=8 + 32 / REFERENCE_HEAD_DIM),
    "qa_int4": IntFormat(name="qa_int4", bits=4, bits_per_element=4 + 32 / REFERENCE_HEAD_DIM),
    "int8_per_token_head": PerTokenHeadFormat(name="int8_per_token_head", kind="int8"),
    "fp8_per_token_head": PerTokenHeadFormat(name="fp8_per_token_head", kind="fp8"),
    "int4_per_token_head": Int4PerTokenHeadFormat(),
    **{name: TurboQuantFormat(name=name, preset=preset) for name, preset in turboquant.PRESETS.items()},
    "ultraquant_4bit": UltraQuantFormat(),
}
FORMAT_NAMES: tuple[str, ...] = tuple(FORMATS)
assert FORMAT_NAMES == KV_FORMAT_NAMES  # the torch-free catalog names exactly these formats, in order
FUSED_NVFP4 = NVFP4Format(fused=True)


def quantize_dequantize(
    fmt: KVFormat, x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype
) -> tuple[QuantizedTensor, torch.Tensor]:
    """(fmt.quantize(x, scale), its values in `dtype`): what a KV-cache write stores and what attention
    reads. NVFP4 and FP8 on CPU compute both in one compiled loop (`quant.formats.compiled`; the same result),
    every other case makes the two eager calls."""
    fast = getattr(fmt, "compiled_roundtrip", None)
    if fast is not None and compiled.enabled(x):
        both = fast(x, scale, dtype)
        if both is not None:
            return both
    q = fmt.quantize(x, scale)
    return q, fmt.dequantize(q, dtype)


def kind_format(fmt: KVFormat, kind: str) -> KVFormat:
    """The format that stores stream `kind` ("k" or "v") of a layer in `fmt`: fmt itself, except a format
    that stores K and V differently (TurboQuant, UltraQuant), whose `k_format` / `v_format` it returns."""
    side = getattr(fmt, f"{kind}_format", None)
    return fmt if side is None else side


def get_format(name: str, *, fused: bool = False) -> KVFormat:
    """The registered format called `name`; QuantError with a did-you-mean for unknown names.

    `fused=True` gives `nvfp4` its torch.compile'd path (same bytes, compiles on first use); other
    formats have one implementation and ignore it.
    """
    fmt = FORMATS.get(name)
    if fmt is not None and fused and name == "nvfp4":
        return FUSED_NVFP4
    if fmt is None:
        raise unknown_format(name)
    return fmt
