"""QuantizedTensor: the bytes a KV-cache kernel stores for one tensor (every format returns one)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QuantizedTensor:
    """A quantized tensor: the stored tensors exactly as a kernel would hold them, plus its decode scale."""

    format: str  # registry name
    shape: tuple[int, ...]  # original shape [..., D]
    data: dict[str, torch.Tensor]  # e.g. nvfp4: {"packed": uint8 [..., D/2], "scales": uint8 [..., D/16]}
    scale: torch.Tensor | None  # per-tensor/per-head DECODE scale (float32) used, if the format has one

    def nbytes(self) -> int:
        """Bytes stored: every data tensor plus the decode scale."""
        total = sum(t.numel() * t.element_size() for t in self.data.values())
        if self.scale is not None:
            total += self.scale.numel() * self.scale.element_size()
        return total
