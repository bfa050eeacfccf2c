"""A KV format that stores K and V differently (TurboQuant, UltraQuant): the format object answers for K,
and each side is a format of its own (`k_format`, `v_format`; `quant.formats.registry.kind_format` picks the
side for a stream)."""

from __future__ import annotations

from typing import Protocol

import torch

from quant.formats.quantized import QuantizedTensor


class KVSide(Protocol):
    """One side (K or V) of a split format."""

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor: ...

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor: ...


class SplitKVFormat:
    """Base of the split formats: `quantize` / `dequantize` are K's; the scales are each row's or group's own."""

    @property
    def k_format(self) -> KVSide:
        raise NotImplementedError

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """K's store of x [..., D] (use `v_format` for V)."""
        return self.k_format.quantize(x, scale)

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """K's read-back of q (use `v_format` for V)."""
        return self.k_format.dequantize(q, dtype)

    def decode_scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """1.0: a split format scales each row or group itself."""
        return torch.ones_like(amax, dtype=torch.float32)
