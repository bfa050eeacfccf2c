"""Fault injection for the emulated KV cache: named presets (plain data) and the hooks a stream calls.

Presets (quant.kv.fault_presets, torch-free, re-exported here): each reproduces a deployment bug or
misconfiguration seen with NVFP4 KV caches, so a gate can be shown to catch it. `fault_spec(name)`
validates a preset into a KVQuantSpec; `base` fields (e.g. a calibrated `scales_file`) are kept unless
the preset sets them.

Hooks: `fault_hooks(spec, layer, kind, format_name)` turns a spec's fault fields into the `FaultHooks`
of one stream (K or V of one layer), or None for a clean stream. The stream stores through them:
every decode scale goes through `scale`, every main-format chunk it writes through `written`
(code corruption), and every chunk it reads back through `read` (a wrong block-scale layout, on
block-scaled formats only).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import torch

from quant.formats.registry import QuantizedTensor
from quant.kv.fault_presets import FAULT_PRESETS, fault_spec  # noqa: F401 - the presets, re-exported
from quant.kv.spec import BLOCK_SCALED_FORMATS, CORRUPTIBLE_FORMATS, KVKind, KVQuantSpec, ScaleLayout

CORRUPT_BLOCK = 16  # elements per corrupted block: NVFP4's scale block along head_dim

@dataclass(frozen=True)
class FaultHooks:
    """The faults of one stream (K or V of one layer): what it does to decode scales and stored bytes."""

    layer: int
    kind: KVKind
    scale_multiplier: float = 1.0  # every decode scale times this
    scale_layout: ScaleLayout = "linear"  # how block-scale bytes are read back
    corrupt_fraction: float = 0.0  # share of CORRUPT_BLOCK-element blocks whose codes are overwritten
    corrupt_seed: int = 0

    @property
    def alters_bytes(self) -> bool:
        """Whether stored bytes are changed or read back otherwise than written (quantize and dequantize
        then cannot run as one call)."""
        return self.corrupt_fraction > 0 or self.scale_layout != "linear"

    def scale(self, d: torch.Tensor) -> torch.Tensor:
        """A decode scale as the faulty cache uses it."""
        return d * self.scale_multiplier

    def written(self, q: QuantizedTensor, write_index: int) -> QuantizedTensor:
        """A main-format chunk as stored: the codes of a seeded random share of blocks replaced by random
        bytes; the draw depends on (seed, layer, kind, write_index) only."""
        if self.corrupt_fraction == 0:
            return q
        key = "packed" if "packed" in q.data else "codes"
        codes = q.data[key]
        raw = codes.view(torch.uint8)
        bytes_per_block = CORRUPT_BLOCK * raw.shape[-1] // q.shape[-1]  # 8 for 4-bit codes, 16 for 8-bit
        nblk = raw.shape[-1] // bytes_per_block
        blocks = raw.reshape(*raw.shape[:-1], nblk, bytes_per_block)  # [B, H, T, nblk, bpb]
        seed = _seed(self.corrupt_seed, self.layer, self.kind == "v", write_index)
        gen = torch.Generator().manual_seed(seed)
        hit = torch.rand(blocks.shape[:-1], generator=gen) < self.corrupt_fraction  # [B, H, T, nblk]
        noise = torch.randint(0, 256, blocks.shape, generator=gen, dtype=torch.uint8)
        out = torch.where(hit.unsqueeze(-1).to(raw.device), noise.to(raw.device), blocks).reshape(raw.shape)
        return replace(q, data={**q.data, key: out.view(codes.dtype)})

    def read(self, q: QuantizedTensor) -> QuantizedTensor:
        """A stored chunk as a reader with `scale_layout` sees it (block-scale bytes only)."""
        scales = q.data.get("scales")
        if self.scale_layout == "linear" or q.format not in BLOCK_SCALED_FORMATS or scales is None:
            return q
        return replace(q, data={**q.data, "scales": _read_scales(scales, self.scale_layout)})


def _read_scales(scales: torch.Tensor, layout: ScaleLayout) -> torch.Tensor:
    """Block-scale bytes [B, H, T, nb] as a reader with layout `layout` sees them.

    "transposed": each token's [H, nb] scale matrix, written row-major, is read column-major (the identity
    when H == 1 or nb == 1, e.g. Gemma-3 270M's single KV head: use "reversed" there);
    "reversed": each token's H * nb scale bytes are read in reverse order (never the identity for > 1 block).
    """
    if layout == "linear":
        return scales
    b, h, t, nb = scales.shape
    per_token = scales.permute(0, 2, 1, 3).reshape(b, t, h * nb)  # [B, T, H*nb], written order
    if layout == "reversed":
        read = per_token.flip(-1)
    else:  # transposed: reader's (h, j) is written flat index j * H + h
        read = per_token.reshape(b, t, nb, h).transpose(-1, -2)
    return read.reshape(b, t, h, nb).permute(0, 2, 1, 3)  # [B, H, T, nb]


def fault_hooks(spec: KVQuantSpec, layer: int, kind: KVKind, format_name: str,
                recent_format: str | None = None) -> FaultHooks | None:
    """The faults `spec` injects into K or V of `layer` stored in `format_name` (its recent window, if
    any, in `recent_format`); None when there are none. The V scale layout reaches block-scaled formats only."""
    block_scaled = {format_name, recent_format} & set(BLOCK_SCALED_FORMATS)
    layout = spec.v_scale_layout if kind == "v" and block_scaled else "linear"
    corrupt = spec.corrupt_block_fraction if format_name in CORRUPTIBLE_FORMATS else 0.0
    if spec.scale_multiplier == 1.0 and layout == "linear" and corrupt == 0:
        return None
    return FaultHooks(layer=layer, kind=kind, scale_multiplier=spec.scale_multiplier, scale_layout=layout,
                      corrupt_fraction=corrupt, corrupt_seed=spec.corrupt_seed)


def _seed(*parts: int) -> int:
    """A 63-bit generator seed from integers (sha256 of their decimal text)."""
    digest = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
