"""The emulated quantized KV cache: a transformers `Cache` that stores K and V as a kernel would (packed
codes, block scales, a decode scale per layer) and hands attention the dequantized values.

Each layer holds one `_Stream` for K and one for V. A stream keeps
- the *main* region: old tokens, in the layer's format (a list of QuantizedTensor chunks);
- the *recent* region: the last `recent_window` tokens in `recent_format`; a token leaving the window
  is re-quantized to the main format from its stored recent-format value (what the cache holds);
- a dequantized shadow of both (model dtype) in one growable buffer (`quant.kv_buffer.KVBuffer`): new tokens are written
  into spare capacity, a token leaving the window is overwritten in place, and attention reads a view
  (no per-step concatenation). Dequantization is elementwise per block, so the shadow equals
  `dequantize(stored bytes)` exactly.

Scales (decode convention, x ~ stored * d): "static" from a calibrated KVScales (amax per layer or
head -> `fmt.decode_scale_from_amax`), "constant" (one decode scale, vLLM's uncalibrated 1.0), or
"dynamic": the amax of the first write of the layer (the prefill) *per sequence* (a [B, 1, 1, 1] scale),
fixed from then on as a real cache does: decode tokens reuse it and may saturate. Per sequence, not
per batch, so an item's result does not depend on what it was batched with; `set_padding_mask` keeps
left-padding positions out of that amax.

`prefill_reads_quantized=False` lets a multi-token write (a prefill chunk) attend to its own fresh K/V
plus the quantized past; single-token decode steps always read the cache.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from quant.errors import QuantError
from quant.formats import KVFormat, QuantizedTensor, get_format, quantize_dequantize
from quant.kv_buffer import BatchOpsMixin, KVBuffer
from quant.kv_spec import CORRUPTIBLE_FORMATS, KVQuantSpec, ScaleLayout
from quant.scales import KVScales

Kind = Literal["k", "v"]
SUPPORTED_LAYER_TYPES: tuple[str, ...] = ("full_attention", "sliding_attention", "chunked_attention")
SLIDING_LAYER_TYPES: tuple[str, ...] = ("sliding_attention", "chunked_attention")
CORRUPT_BLOCK = 16  # elements per corrupted block: NVFP4's scale block along head_dim
CONSOLIDATE_CHUNKS = 64  # merge the main region's chunk list when it grows past this (amortized concat)


@dataclass(frozen=True)
class StreamPlan:
    """How K or V of one layer is stored."""

    layer: int
    kind: Kind
    fmt: KVFormat  # main (old-token) format
    recent_fmt: KVFormat | None  # None when window == 0
    window: int
    static_scale: torch.Tensor | None  # main decode scale, () or [1, H, 1, 1]; None = dynamic
    recent_static_scale: torch.Tensor | None
    dynamic: bool  # scales from the first write, per sequence
    multiplier: float  # fault hook: every decode scale times this
    scale_layout: ScaleLayout  # fault hook: how block-scale bytes are read back (V only)
    corrupt_fraction: float  # fault hook: share of 16-element blocks whose codes are overwritten
    corrupt_seed: int


@dataclass(frozen=True)
class LayerStorage:
    """Bytes the cache holds for one layer (quantized codes, block scales, decode scales)."""

    layer: int
    format: str
    k_bytes: int
    v_bytes: int
    k_elements: int  # stored K values (batch * heads * tokens * head_dim)
    v_elements: int


def _cat(chunks: list[QuantizedTensor]) -> QuantizedTensor:
    """Concatenate same-format, same-scale chunks [B, H, T_i, ...] along the token dim (-2 of each tensor)."""
    if len(chunks) == 1:
        return chunks[0]
    first = chunks[0]
    data = {key: torch.cat([c.data[key] for c in chunks], dim=-2) for key in first.data}
    tokens = sum(c.shape[-2] for c in chunks)
    return replace(first, shape=(*first.shape[:-2], tokens, first.shape[-1]), data=data)


def _slice(q: QuantizedTensor, start: int, stop: int) -> QuantizedTensor:
    """Tokens start:stop of q [B, H, T, ...]."""
    data = {key: t[..., start:stop, :] for key, t in q.data.items()}
    return replace(q, shape=(*q.shape[:-2], stop - start, q.shape[-1]), data=data)


def _data_bytes(q: QuantizedTensor) -> int:
    return sum(t.numel() * t.element_size() for t in q.data.values())


def _read_scales(scales: torch.Tensor, layout: ScaleLayout) -> torch.Tensor:
    """Block-scale bytes [B, H, T, nb] as a reader with the wrong layout would see them (fault emulation).

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


def _as_4d(d: torch.Tensor) -> torch.Tensor:
    """A decode scale () or [B|1, H|1, 1, 1] as 4-D."""
    return d.reshape(1, 1, 1, 1) if d.dim() == 0 else d


def _seed(*parts: int) -> int:
    digest = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _repeat_token(q: QuantizedTensor, n: int) -> QuantizedTensor:
    """A one-token QuantizedTensor [B, H, 1, ...] repeated to n tokens."""
    data = {key: t.expand(*t.shape[:-2], n, t.shape[-1]).contiguous() for key, t in q.data.items()}
    return replace(q, shape=(*q.shape[:-2], n, q.shape[-1]), data=data)


def _with_row(scale: torch.Tensor | None, row: int, other: torch.Tensor | None) -> torch.Tensor | None:
    """A per-sequence scale [B, ...] with row `row` replaced by `other`'s [1, ...] (a copy)."""
    if scale is None or other is None or scale.dim() == 0:
        return scale
    out = scale.clone()
    out[row] = other[0]
    return out


def _cat_rows(scales: list[torch.Tensor | None]) -> torch.Tensor | None:
    """Per-sequence scales [1, ...] of several streams as one [B, ...] tensor."""
    if scales[0] is None or scales[0].dim() == 0:
        return scales[0]
    return torch.cat(scales, dim=0)  # type: ignore[arg-type]


def _set_row(q: QuantizedTensor, row: int, other: QuantizedTensor, scale: torch.Tensor | None) -> QuantizedTensor:
    """q with sequence `row` of every stored tensor replaced (in place) by other's sequence 0."""
    for key, t in q.data.items():
        t[row] = other.data[key][0]
    return replace(q, scale=scale if q.scale is not None else None)


def _stack_q(qs: list[QuantizedTensor], scale: torch.Tensor | None) -> QuantizedTensor:
    """Same-format QuantizedTensors [B_i, H, T, ...] concatenated along the batch dim."""
    first = qs[0]
    data = {key: torch.cat([q.data[key] for q in qs], dim=0) for key in first.data}
    batch = sum(q.shape[0] for q in qs)
    return replace(first, shape=(batch, *first.shape[1:]), data=data,
                   scale=scale if first.scale is not None else None)


class _Stream:
    """K or V of one layer: quantized main + recent regions and their dequantized shadow."""

    def __init__(self, plan: StreamPlan) -> None:
        self.plan = plan
        self.reset()

    def reset(self) -> None:
        self.main: list[QuantizedTensor] = []
        self.recent: QuantizedTensor | None = None
        self.shadow = KVBuffer()  # dequantized main tokens, then recent tokens (model dtype)
        self._main_len = 0
        self.scale: torch.Tensor | None = self._static(self.plan.fmt, self.plan.static_scale)
        self.recent_scale: torch.Tensor | None = (
            self._static(self.plan.recent_fmt, self.plan.recent_static_scale)
            if self.plan.recent_fmt
            else None
        )
        self.scales_ready = not self.plan.dynamic
        self.writes = 0  # quantized main chunks written so far (seeds corruption)
        self.dtype: torch.dtype | None = None

    def _static(self, fmt: KVFormat, d: torch.Tensor | None) -> torch.Tensor | None:
        if not fmt.needs_tensor_scale or d is None:
            return None
        return d * self.plan.multiplier

    # ---- lengths and views ----
    @property
    def main_len(self) -> int:
        return self._main_len

    @property
    def recent_len(self) -> int:
        return self.shadow.length - self._main_len

    def __len__(self) -> int:
        return self.shadow.length

    def view(self) -> torch.Tensor:
        """Dequantized stored tokens [B, H, T, D] in model dtype, oldest first (a view of the shadow)."""
        out = self.shadow.tensor()
        assert out is not None, "view() before the first write"
        return out

    # ---- writing ----
    def init_dynamic_scales(self, x: torch.Tensor, valid: torch.Tensor | None) -> None:
        """Per-sequence decode scales from amax over heads, tokens and dims of x [B, H, T, D]."""
        a = x.detach().abs().to(torch.float32)
        if valid is not None:  # [B, T] bool: padding positions do not count
            a = torch.where(valid[:, None, :, None].to(a.device), a, 0.0)
        amax = a.amax(dim=(1, 2, 3), keepdim=True)  # [B, 1, 1, 1]
        if not bool(torch.isfinite(amax).all()):
            raise QuantError(
                f"layer {self.plan.layer} {self.plan.kind.upper()} holds NaN or Inf: a KV cache with "
                "non-finite values is a model bug"
            )
        for attr, fmt in (("scale", self.plan.fmt), ("recent_scale", self.plan.recent_fmt)):
            if fmt is not None and fmt.needs_tensor_scale:
                setattr(self, attr, fmt.decode_scale_from_amax(amax) * self.plan.multiplier)
        self.scales_ready = True

    def _dequantize(self, fmt: KVFormat, q: QuantizedTensor, dtype: torch.dtype) -> torch.Tensor:
        if (
            self.plan.scale_layout != "linear"
            and "scales" in q.data
            and q.data["scales"].dtype == torch.uint8
        ):
            q = replace(q, data={**q.data, "scales": _read_scales(q.data["scales"], self.plan.scale_layout)})
        return fmt.dequantize(q, dtype)

    def _corrupt(self, q: QuantizedTensor) -> QuantizedTensor:
        """Overwrite the codes of a seeded random share of 16-element blocks with random bytes (a fault)."""
        key = "packed" if "packed" in q.data else "codes"
        codes = q.data[key]
        raw = codes.view(torch.uint8)
        bytes_per_block = CORRUPT_BLOCK * raw.shape[-1] // q.shape[-1]  # 8 for 4-bit codes, 16 for 8-bit
        blocks = raw.reshape(
            *raw.shape[:-1], raw.shape[-1] // bytes_per_block, bytes_per_block
        )  # [B, H, T, nblk, bpb]
        gen = torch.Generator().manual_seed(
            _seed(self.plan.corrupt_seed, self.plan.layer, self.plan.kind == "v", self.writes)
        )
        hit = torch.rand(blocks.shape[:-1], generator=gen) < self.plan.corrupt_fraction  # [B, H, T, nblk]
        noise = torch.randint(0, 256, blocks.shape, generator=gen, dtype=torch.uint8)
        out = torch.where(hit.unsqueeze(-1).to(raw.device), noise.to(raw.device), blocks).reshape(raw.shape)
        return replace(q, data={**q.data, key: out.view(codes.dtype)})

    def _plain_readback(self) -> bool:
        """Stored bytes are read back as written (no fault hook), so quantize and dequantize may run
        as one call."""
        return self.plan.corrupt_fraction == 0 and self.plan.scale_layout == "linear"

    def _append_main(self, x: torch.Tensor, from_recent: bool = False) -> None:
        if self._plain_readback():
            q, new = quantize_dequantize(self.plan.fmt, x, self.scale, self.dtype)  # type: ignore[arg-type]
            self.add_main_chunk(q, new, from_recent=from_recent)
            return
        q = self.plan.fmt.quantize(x, self.scale)
        if self.plan.corrupt_fraction > 0:
            q = self._corrupt(q)
        self.add_main_chunk(q, self._dequantize(self.plan.fmt, q, self.dtype), from_recent=from_recent)  # type: ignore[arg-type]

    def add_main_chunk(self, q: QuantizedTensor, new: torch.Tensor, *, from_recent: bool = False) -> None:
        """Add a quantized chunk and its dequantized values [B, H, n, D] to the main region: new tokens
        (the recent region is empty), or, `from_recent`, the oldest recent tokens re-quantized."""
        self.writes += 1
        self.main.append(q)
        if len(self.main) > CONSOLIDATE_CHUNKS:
            self.main = [_cat(self.main)]
        if from_recent:
            self.shadow.overwrite(self._main_len, new)
        else:
            assert self.recent_len == 0, "new main tokens go after the recent region only when it is empty"
            self.shadow.append(new)
        self._main_len += new.shape[-2]

    def _append_recent(self, x: torch.Tensor) -> None:
        fmt = self.plan.recent_fmt
        assert fmt is not None
        if self._plain_readback():
            q, new = quantize_dequantize(fmt, x, self.recent_scale, self.dtype)  # type: ignore[arg-type]
        else:
            q = fmt.quantize(x, self.recent_scale)
            new = self._dequantize(fmt, q, self.dtype)  # type: ignore[arg-type]
        self.recent = q if self.recent is None else _cat([self.recent, q])
        self.shadow.append(new)

    def append(self, x: torch.Tensor) -> None:
        """Store new tokens x [B, H, n, D]; tokens pushed out of the recent window move to the main format."""
        x = x.contiguous()  # attention hands K/V as a transposed view; the quantizers prefer dense input
        self.dtype = x.dtype
        n = x.shape[-2]
        window = self.plan.window
        if window == 0:
            if n or self.shadow.buf is None:
                self._append_main(x)
            return
        r = self.recent_len
        overflow = max(0, r + n - window)
        move = min(overflow, r)
        if move:  # oldest recent tokens leave the window: re-quantize their stored values
            assert self.recent is not None and self.plan.recent_fmt is not None
            leaving = _slice(self.recent, 0, move)
            self._append_main(self._dequantize(self.plan.recent_fmt, leaving, torch.float32), from_recent=True)
            self.recent = _slice(self.recent, move, r)
        direct = overflow - move  # new tokens already older than the window: straight to the main format
        if direct:
            self._append_main(x[..., :direct, :].contiguous())
        if n - direct or self.shadow.buf is None:
            self._append_recent(x[..., direct:, :].contiguous())

    # ---- removing tokens ----
    def _consolidate(self) -> None:
        if len(self.main) > 1:
            self.main = [_cat(self.main)]

    def drop_oldest(self, n: int) -> None:
        """Forget the n oldest stored tokens (sliding-window eviction)."""
        from_main = min(n, self.main_len)
        if from_main:
            self._consolidate()
            self.main = [_slice(self.main[0], from_main, self.main_len)]
        rest = n - from_main
        if rest:
            assert self.recent is not None
            self.recent = _slice(self.recent, rest, self.recent_len)
        self._main_len -= from_main
        self.shadow.drop_oldest(n)

    def drop_latest(self, n: int) -> None:
        """Forget the n newest stored tokens (crop)."""
        from_recent = min(n, self.recent_len)
        if from_recent:
            assert self.recent is not None
            self.recent = _slice(self.recent, 0, self.recent_len - from_recent)
        rest = n - from_recent
        if rest:
            self._consolidate()
            self.main = [_slice(self.main[0], 0, self.main_len - rest)]
            self._main_len -= rest
        self.shadow.drop_latest(n)

    # ---- batch ----
    def map_batch(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Apply a batch-dim operation (select, repeat, reorder) to every stored tensor and per-row scale."""
        if self.plan.dynamic and self.scales_ready:
            self.scale = fn(self.scale) if self.scale is not None else None
            self.recent_scale = fn(self.recent_scale) if self.recent_scale is not None else None

        def remap(q: QuantizedTensor, scale: torch.Tensor | None) -> QuantizedTensor:
            data = {key: fn(t) for key, t in q.data.items()}
            first = next(iter(data.values()))
            return replace(
                q,
                data=data,
                scale=scale if q.scale is not None else None,
                shape=(first.shape[0], *q.shape[1:]),
            )

        self.main = [remap(q, self.scale) for q in self.main]
        self.recent = remap(self.recent, self.recent_scale) if self.recent is not None else None
        self.shadow.map_batch(fn)

    # ---- rows (per-sequence prefill, batched decode) ----
    def pad_left(self, n: int) -> None:
        """Put n zero tokens before the oldest one, in the region a longer sequence would hold them in:
        the recent window first while the main region is empty, then the main region."""
        if n <= 0:
            return
        ref = self.view()
        to_recent = min(n, self.plan.window - self.recent_len) if self.main_len == 0 and self.plan.window else 0
        to_main = n - to_recent
        zero = ref.new_zeros((*ref.shape[:-2], 1, ref.shape[-1]))  # one zero token: tokens quantize alike
        if to_recent:
            assert self.plan.recent_fmt is not None
            q = _repeat_token(self.plan.recent_fmt.quantize(zero, self.recent_scale), to_recent)
            self.recent = q if self.recent is None else _cat([q, self.recent])
        if to_main:
            self.main.insert(0, _repeat_token(self.plan.fmt.quantize(zero, self.scale), to_main))
            self._main_len += to_main
        self.shadow.pad_left(n)

    def set_row(self, row: int, other: _Stream) -> None:
        """Overwrite batch row `row` with `other`'s single sequence (same region lengths): stored bytes,
        per-sequence scales and dequantized values, nothing re-quantized."""
        if (other.main_len, other.recent_len) != (self.main_len, self.recent_len):
            raise QuantError(
                f"row regions {other.main_len}+{other.recent_len} do not match the batch's "
                f"{self.main_len}+{self.recent_len}; pad the row first"
            )
        self._consolidate()
        other._consolidate()
        if self.plan.dynamic:
            self.scale = _with_row(self.scale, row, other.scale)
            self.recent_scale = _with_row(self.recent_scale, row, other.recent_scale)
        if self.main:
            self.main[0] = _set_row(self.main[0], row, other.main[0], self.scale)
        if self.recent is not None and other.recent is not None:
            self.recent = _set_row(self.recent, row, other.recent, self.recent_scale)
        self.shadow.set_row(row, other.shadow)

    @staticmethod
    def stack(streams: list[_Stream]) -> _Stream:
        """One stream holding every stream's sequences in order (same plan and region lengths)."""
        first = streams[0]
        if any((s.main_len, s.recent_len) != (first.main_len, first.recent_len) for s in streams):
            raise QuantError("streams of different lengths cannot be stacked; pad them first")
        for s in streams:
            s._consolidate()
        out = _Stream(first.plan)
        out._main_len, out.dtype = first._main_len, first.dtype
        out.writes = max(s.writes for s in streams)
        out.scales_ready = all(s.scales_ready for s in streams)
        if first.plan.dynamic:
            out.scale = _cat_rows([s.scale for s in streams])
            out.recent_scale = _cat_rows([s.recent_scale for s in streams])
        if first.main:
            out.main = [_stack_q([s.main[0] for s in streams], out.scale)]
        if first.recent is not None:
            out.recent = _stack_q([s.recent for s in streams], out.recent_scale)  # type: ignore[misc]
        out.shadow = KVBuffer.stack([s.shadow for s in streams])
        return out

    # ---- inspection ----
    def stored(self) -> tuple[QuantizedTensor | None, QuantizedTensor | None]:
        """(main, recent) quantized regions as single QuantizedTensors (None when empty)."""
        self._consolidate()
        return (self.main[0] if self.main else None), self.recent

    def nbytes(self) -> int:
        """Stored bytes: codes and block scales of both regions, plus each decode scale tensor once."""
        total = sum(_data_bytes(q) for q in self.main) + (_data_bytes(self.recent) if self.recent else 0)
        for d in (self.scale if self.main else None, self.recent_scale if self.recent else None):
            if d is not None:
                total += d.numel() * d.element_size()
        return total

    def elements(self) -> int:
        """Number of stored K or V values."""
        v = self.view() if len(self) else None
        return 0 if v is None else v.numel()


class QuantizedKVLayer(BatchOpsMixin, DynamicLayer):
    """One full-attention layer of the emulated cache: K and V stored quantized, read dequantized."""

    is_sliding = False

    def __init__(self, k_plan: StreamPlan, v_plan: StreamPlan, prefill_reads_quantized: bool = True) -> None:
        super().__init__()
        self.k = _Stream(k_plan)
        self.v = _Stream(v_plan)
        self.prefill_reads_quantized = prefill_reads_quantized
        self.cumulative_length = 0
        self.padding_mask: torch.Tensor | None = None  # [B, T_first] bool, for dynamic amax only
        self._joint_scales: dict[str, tuple] = {}  # which -> (K scale, V scale, both stacked), joint K/V path
        # a recent window cannot be rolled back exactly: tokens it pushed out stay re-quantized
        self.is_croppable = k_plan.window == 0

    @property
    def format(self) -> str:
        """Main storage format of this layer."""
        return self.k.plan.fmt.name

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Record device and dtype; storage starts empty."""
        self.device = key_states.device
        self.keys = key_states[..., :0, :]
        self.values = value_states[..., :0, :]
        self.is_initialized = True

    def _write(
        self, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if not self.k.scales_ready and n:
            valid = self.padding_mask
            if valid is not None and tuple(valid.shape) != (key_states.shape[0], n):
                valid = None  # the mask was for another batch or prompt length
            self.k.init_dynamic_scales(key_states, valid)
            self.v.init_dynamic_scales(value_states, valid)
        if self._joint:
            self._append_joint(key_states, value_states)
        else:
            self.k.append(key_states)
            self.v.append(value_states)
        self.cumulative_length += n
        keys, values = self.k.view(), self.v.view()
        self.keys, self.values = keys, values
        if not self.prefill_reads_quantized and n > 1:
            keys = torch.cat([keys[..., : keys.shape[-2] - n, :], key_states], dim=-2)
            values = torch.cat([values[..., : values.shape[-2] - n, :], value_states], dim=-2)
        return keys, values

    @property
    def _joint(self) -> bool:
        """K and V can go through one quantize / dequantize call each (fewer kernel launches per step)."""
        pk, pv = self.k.plan, self.v.plan
        return (
            pk.fmt.name == pv.fmt.name
            and pk.window == pv.window
            and getattr(pk.recent_fmt, "name", None) == getattr(pv.recent_fmt, "name", None)
            and pk.corrupt_fraction == pv.corrupt_fraction == 0
            and pv.scale_layout == "linear"
        )

    def _pair_scale(self, which: str) -> torch.Tensor | None:
        """The K and V decode scales `which` ("scale" or "recent_scale") stacked [2, B|1, H|1, 1, 1]."""
        dk, dv = getattr(self.k, which), getattr(self.v, which)
        cached = self._joint_scales.get(which)
        if cached is None or cached[0] is not dk or cached[1] is not dv:  # scales set or remapped since
            d = None
            if dk is not None and dv is not None:
                d = torch.stack(torch.broadcast_tensors(_as_4d(dk), _as_4d(dv)))
            cached = self._joint_scales[which] = (dk, dv, d)
        return cached[2]

    def _quantize_pair(
        self, fmt: KVFormat, which: str, pair: torch.Tensor
    ) -> tuple[list[QuantizedTensor], torch.Tensor]:
        """Quantize K and V stacked [2, B, H, n, D] with their own decode scales: the two streams'
        QuantizedTensors (the same bytes as two calls) and the dequantized pair in model dtype."""
        q, new = quantize_dequantize(fmt, pair, self._pair_scale(which), self.k.dtype)  # type: ignore[arg-type]
        parts = [
            QuantizedTensor(q.format, tuple(pair.shape[1:]), {key: t[i] for key, t in q.data.items()},
                            getattr(stream, which))
            for i, stream in enumerate((self.k, self.v))
        ]
        return parts, new

    def _append_joint(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """`_Stream.append` for K and V together: same regions, window moves and bytes, half the calls."""
        if key_states.shape != value_states.shape or key_states.dtype != value_states.dtype:
            self.k.append(key_states)
            self.v.append(value_states)
            return
        k, v = self.k, self.v
        k.dtype = v.dtype = key_states.dtype
        x = torch.stack([key_states, value_states])  # [2, B, H, n, D]
        n, window, fmt = x.shape[-2], k.plan.window, k.plan.fmt
        if window == 0:
            if n or k.shadow.buf is None:
                parts, new = self._quantize_pair(fmt, "scale", x)
                k.add_main_chunk(parts[0], new[0])
                v.add_main_chunk(parts[1], new[1])
            return
        recent_fmt = k.plan.recent_fmt
        assert recent_fmt is not None
        r = k.recent_len
        overflow = max(0, r + n - window)
        move = min(overflow, r)
        if move:  # oldest recent tokens leave the window: re-quantize their stored values
            leaving = [_slice(s.recent, 0, move) for s in (k, v)]  # type: ignore[arg-type]
            stacked = replace(leaving[0], shape=(2, *leaving[0].shape),
                              data={key: torch.stack([q.data[key] for q in leaving]) for key in leaving[0].data},
                              scale=self._pair_scale("recent_scale"))
            parts, new = self._quantize_pair(fmt, "scale", recent_fmt.dequantize(stacked, torch.float32))
            for i, s in enumerate((k, v)):
                s.add_main_chunk(parts[i], new[i], from_recent=True)
                s.recent = _slice(s.recent, move, r)  # type: ignore[arg-type]
        direct = overflow - move  # new tokens already older than the window: straight to the main format
        if direct:
            parts, new = self._quantize_pair(fmt, "scale", x[..., :direct, :])
            k.add_main_chunk(parts[0], new[0])
            v.add_main_chunk(parts[1], new[1])
        if n - direct or k.shadow.buf is None:
            parts, new = self._quantize_pair(recent_fmt, "recent_scale", x[..., direct:, :])
            for i, s in enumerate((k, v)):
                s.recent = parts[i] if s.recent is None else _cat([s.recent, parts[i]])
                s.shadow.append(new[i])

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store K/V [B, H, n, D] quantized; return everything attention sees (dequantized), oldest first."""
        return self._write(key_states, value_states)

    def get_seq_length(self) -> int:
        """Tokens written so far."""
        return self.cumulative_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) for the attention mask."""
        return self.cumulative_length + query_length, 0

    def reset(self) -> None:
        """Drop all stored tokens and dynamic scales."""
        self.k.reset()
        self.v.reset()
        self.keys = self.values = None
        self.is_initialized = False
        self.cumulative_length = 0

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last |tokens_to_remove| tokens (negative count, as DynamicLayer.crop)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        n = min(abs(tokens_to_remove), self.cumulative_length)
        if n == 0 or not self.is_initialized:
            return
        self.k.drop_latest(n)
        self.v.drop_latest(n)
        self.cumulative_length -= n
        self.keys, self.values = self.k.view(), self.v.view()

    def _map_batch(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        if not self.is_initialized:
            return
        self.k.map_batch(fn)
        self.v.map_batch(fn)
        self._views()

    # ---- rows: sequences prefilled one by one, decoded as a right-aligned batch ----
    def _views(self) -> None:
        self.keys, self.values = self.k.view(), self.v.view()

    def pad_left(self, n: int) -> None:
        """Put n zero tokens (masked by the caller) before every sequence's oldest token."""
        if n <= 0 or not self.is_initialized:
            return
        self.k.pad_left(n)
        self.v.pad_left(n)
        self.cumulative_length += n
        self._views()

    def drop_oldest(self, n: int) -> None:
        """Forget the n oldest token positions of every sequence (positions that are padding for all)."""
        if n <= 0 or not self.is_initialized:
            return
        self.k.drop_oldest(n)
        self.v.drop_oldest(n)
        self.cumulative_length -= n
        self._views()

    def set_row(self, row: int, other: QuantizedKVLayer) -> None:
        """Overwrite sequence `row` with `other`'s single sequence of the same length."""
        self.k.set_row(row, other.k)
        self.v.set_row(row, other.v)
        self._joint_scales = {}
        self._views()

    @classmethod
    def stack(cls, layers: list[QuantizedKVLayer]) -> QuantizedKVLayer:
        """One layer holding the sequences of `layers` (same plans and lengths), in order."""
        first = layers[0]
        out = cls(first.k.plan, first.v.plan, first.prefill_reads_quantized)
        out.k = _Stream.stack([layer.k for layer in layers])
        out.v = _Stream.stack([layer.v for layer in layers])
        out.device, out.is_initialized, out.cumulative_length = first.device, True, first.cumulative_length
        out._views()
        return out

    def offload(self) -> None:
        """Not supported: the emulated cache stays on its device."""

    def prefetch(self) -> None:
        """Not supported: the emulated cache stays on its device."""

    def storage(self, layer: int) -> LayerStorage:
        """Bytes and element counts of this layer's stored K and V."""
        return LayerStorage(
            layer=layer,
            format=self.format,
            k_bytes=self.k.nbytes(),
            v_bytes=self.v.nbytes(),
            k_elements=self.k.elements(),
            v_elements=self.v.elements(),
        )


class QuantizedSlidingKVLayer(QuantizedKVLayer):
    """A sliding-window layer (Gemma-3 local attention): keeps the last `sliding_window - 1` tokens."""

    is_sliding = True

    def __init__(
        self,
        k_plan: StreamPlan,
        v_plan: StreamPlan,
        sliding_window: int,
        prefill_reads_quantized: bool = True,
    ) -> None:
        super().__init__(k_plan, v_plan, prefill_reads_quantized)
        self.sliding_window = sliding_window
        self.is_croppable = False

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store, return past window + new tokens (dequantized), then evict down to `sliding_window - 1`."""
        keys, values = self._write(key_states, value_states)
        excess = len(self.k) - (self.sliding_window - 1)
        if excess > 0:
            self.k.drop_oldest(excess)
            self.v.drop_oldest(excess)
            self.keys, self.values = self.k.view(), self.v.view()
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) as DynamicSlidingWindowLayer."""
        kv_offset = max(self.cumulative_length - self.sliding_window + 1, 0)
        if self.cumulative_length >= self.sliding_window:
            return self.sliding_window - 1 + query_length, kv_offset
        return self.cumulative_length + query_length, kv_offset

    def get_max_length(self) -> int:
        """The window size."""
        return self.sliding_window

    def _no_rows(self, *args, **kwargs):
        raise QuantError("row operations need full-attention layers; this model has sliding-window layers")

    pad_left = drop_oldest = set_row = _no_rows  # type: ignore[assignment]

    def crop(self, tokens_to_remove: int) -> None:
        """Crop within the window only (evicted tokens cannot come back)."""
        if self.cumulative_length >= self.sliding_window and tokens_to_remove != 0:
            raise QuantError("cannot crop a sliding-window layer of the quantized cache past its window")
        super().crop(tokens_to_remove)


class QuantizedKVCache(Cache):
    """The emulated quantized KV cache; build it with `make_cache`."""

    def __init__(self, layers: list[QuantizedKVLayer], spec: KVQuantSpec) -> None:
        super().__init__(layers=layers)
        self.spec = spec

    def set_padding_mask(self, attention_mask: torch.Tensor) -> None:
        """Exclude padding positions ([B, T] 0/1 mask of the first write) from dynamic per-sequence amax."""
        for layer in self.layers:
            layer.padding_mask = attention_mask.bool()

    def storage(self) -> list[LayerStorage]:
        """Per-layer stored bytes and element counts."""
        return [layer.storage(i) for i, layer in enumerate(self.layers)]

    def nbytes(self) -> int:
        """Total stored bytes (K and V of every layer)."""
        return sum(s.k_bytes + s.v_bytes for s in self.storage())

    @property
    def supports_rows(self) -> bool:
        """Whether `pad_left`, `set_row`, `drop_oldest` and `stack` work (every layer full attention)."""
        return not any(layer.is_sliding for layer in self.layers)

    def pad_left(self, n: int) -> None:
        """Put n zero tokens before every sequence (right-aligning it with a longer batch)."""
        for layer in self.layers:
            layer.pad_left(n)

    def drop_oldest(self, n: int) -> None:
        """Forget the n oldest positions of every sequence (padding for all of them)."""
        for layer in self.layers:
            layer.drop_oldest(n)

    def set_row(self, row: int, other: QuantizedKVCache) -> None:
        """Overwrite sequence `row` with `other`'s single sequence of the same length (pad it first)."""
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            mine.set_row(row, theirs)

    @classmethod
    def stack(cls, caches: list[QuantizedKVCache]) -> QuantizedKVCache:
        """One cache holding the sequences of `caches` (same spec and length), in order."""
        if not all(c.supports_rows for c in caches):
            raise QuantError("row operations need full-attention layers; this model has sliding-window layers")
        layers = [QuantizedKVLayer.stack([c.layers[i] for c in caches]) for i in range(len(caches[0].layers))]
        return cls(layers, caches[0].spec)

    def clone(self) -> QuantizedKVCache:
        """An independent copy (e.g. of a few-shot prefix) that shares no tensors; nothing is re-quantized."""
        return copy.deepcopy(self)


class ObservingCache(DynamicCache):
    """A plain DynamicCache showing each written K/V [B, H, n, D] (after RoPE) to `observer(layer, k, v)`."""

    def __init__(self, config, observer: Callable[[int, torch.Tensor, torch.Tensor], None]) -> None:
        super().__init__(config=config)
        self.observer = observer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Observe, then store and return unchanged (the model's outputs are not affected)."""
        self.observer(layer_idx, key_states, value_states)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


# ---------------------------------------------------------------- factory


@dataclass(frozen=True)
class ModelKVShape:
    """What the cache needs to know about a model's attention layers."""

    layer_types: tuple[str, ...]
    sliding_windows: tuple[int | None, ...]
    num_kv_heads: int
    head_dim: int


def model_kv_shape(model_config) -> ModelKVShape:
    """Layer types, windows, KV heads and head_dim of a decoder-only model; QuantError if unsupported."""
    if getattr(model_config, "is_encoder_decoder", False):
        raise QuantError(
            f"model type {model_config.model_type!r} is encoder-decoder; the quantized KV cache "
            "supports decoder-only models"
        )
    cfg = model_config.get_text_config(decoder=True)
    num_layers = getattr(cfg, "num_hidden_layers", None)
    heads = getattr(cfg, "num_attention_heads", None)
    if not num_layers or not heads:
        raise QuantError(
            f"model type {cfg.model_type!r}: no num_hidden_layers / num_attention_heads in its config; "
            "the quantized KV cache supports transformers decoder-only attention models"
        )
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        types, kwargs = get_layer_types_and_kwargs(cfg)
        windows = [kw.get("sliding_window") for kw in kwargs]
    except (ImportError, AttributeError):  # older transformers: infer from the config
        types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * num_layers)
        windows = [getattr(cfg, "sliding_window", None) if t in SLIDING_LAYER_TYPES else None for t in types]
    bad = sorted(set(types) - set(SUPPORTED_LAYER_TYPES))
    if bad:
        raise QuantError(
            f"model type {cfg.model_type!r} has layer types {bad}; the quantized KV cache supports "
            f"{', '.join(SUPPORTED_LAYER_TYPES)} layers only"
        )
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    return ModelKVShape(tuple(types), tuple(windows), int(kv_heads), int(head_dim))


def _check_format_fits(fmt: KVFormat, head_dim: int, layer: int) -> None:
    try:
        fmt.quantize(torch.ones(1, 1, 1, head_dim), None)
    except QuantError as exc:
        raise QuantError(
            f"layer {layer}: format {fmt.name!r} cannot store head_dim {head_dim}: {exc}"
        ) from None


def _scale_for(
    spec: KVQuantSpec, scales: KVScales | None, fmt: KVFormat, layer: int, kind: Kind
) -> torch.Tensor | None:
    """Static or constant decode scale of one stream (before the fault multiplier), None when dynamic."""
    if spec.scales == "constant":
        return torch.tensor(float(spec.constant_scale), dtype=torch.float32)  # type: ignore[arg-type]
    if spec.scales == "static":
        assert scales is not None
        return fmt.decode_scale_from_amax(scales.amax(layer, kind))
    return None


def make_cache(model_config, spec: KVQuantSpec, scales: KVScales | None = None) -> QuantizedKVCache:
    """A fresh emulated KV cache for a model config; static scales from `scales` or `spec.scales_file`."""
    shape = model_kv_shape(model_config)
    num_layers = len(shape.layer_types)
    named = sorted({*spec.skip_layers, *spec.layer_formats})
    if named and named[-1] >= num_layers:
        raise QuantError(
            f"kv cache spec names layer {named[-1]}, but the model has {num_layers} layers "
            f"(0..{num_layers - 1})"
        )
    if spec.scales == "static":
        if scales is None:
            if spec.scales_file is None:
                raise QuantError(
                    "scales = 'static' needs calibrated scales: set scales_file (made by `qa calibrate`)"
                )
            scales = KVScales.load(spec.scales_file)
        if scales.num_layers != num_layers:
            raise QuantError(
                f"the scales file covers {scales.num_layers} layers, the model has {num_layers}; "
                "calibrate scales for this model"
            )
        if scales.meta.granularity == "head" and scales.meta.num_kv_heads != shape.num_kv_heads:
            raise QuantError(
                f"the scales file has {scales.meta.num_kv_heads} KV heads per layer, the model has "
                f"{shape.num_kv_heads}"
            )
    elif scales is not None:
        raise QuantError(
            f"scales were given but the spec uses scales = {spec.scales!r}; set scales = 'static'"
        )

    recent_fmt = get_format(spec.recent_format) if spec.recent_window else None
    if recent_fmt is not None:
        _check_format_fits(recent_fmt, shape.head_dim, 0)
    layers: list[QuantizedKVLayer] = []
    for i, (layer_type, window) in enumerate(zip(shape.layer_types, shape.sliding_windows)):
        fmt = get_format(spec.layer_format(i))
        _check_format_fits(fmt, shape.head_dim, i)
        skipped = fmt.name == "none"
        layer_recent = None if skipped else recent_fmt
        plans = [
            StreamPlan(
                layer=i,
                kind=kind,
                fmt=fmt,
                recent_fmt=layer_recent,
                window=0 if layer_recent is None else spec.recent_window,
                static_scale=_scale_for(spec, scales, fmt, i, kind),
                recent_static_scale=_scale_for(spec, scales, layer_recent, i, kind) if layer_recent else None,
                dynamic=spec.scales == "dynamic",
                multiplier=spec.scale_multiplier,
                scale_layout=spec.v_scale_layout if kind == "v" else "linear",
                corrupt_fraction=spec.corrupt_block_fraction if fmt.name in CORRUPTIBLE_FORMATS else 0.0,
                corrupt_seed=spec.corrupt_seed,
            )
            for kind in ("k", "v")
        ]
        if layer_type in SLIDING_LAYER_TYPES:
            if not window:
                raise QuantError(f"layer {i} is {layer_type} but the config has no window size")
            layers.append(
                QuantizedSlidingKVLayer(
                    *plans, sliding_window=int(window), prefill_reads_quantized=spec.prefill_reads_quantized
                )
            )
        else:
            layers.append(QuantizedKVLayer(*plans, prefill_reads_quantized=spec.prefill_reads_quantized))
    return QuantizedKVCache(layers, spec)
