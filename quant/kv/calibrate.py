"""Calibration of static KV-cache scales: run token chunks through the model, observe K (after RoPE) and V per
layer as they are written to the cache, and choose one clip value (amax) per layer, or per layer and KV head.

Observers:
- absmax: the largest |x| seen.
- percentile: the p-th percentile of |x| (inverted-CDF definition: the smallest observed |x| with at least
  p% of the values <= it; numpy's method="inverted_cdf"), computed exactly by keeping only the top
  M - ceil(M * p / 100) + 1 values of the M observed.
- mse: a second pass that tries clip factors c in MSE_GRID (c * absmax) and keeps, per layer (and head),
  the one whose format reconstruction has the smallest squared error on the observed values (on every
  k-th token when there are more than `mse_max_tokens` tokens; the absmax is still over all of them).

The decode scale written next to the amax follows the format's convention (d = amax / (448 * 6) for NVFP4,
amax / 448 for FP8 E4M3). Calibration is deterministic: the chunks are chosen with a seeded generator and
the model runs in eval mode without sampling.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field

from quant.errors import QuantError
from quant.formats.registry import KVFormat, get_format
from quant.kv.observe import ObservingCache
from quant.kv.shape import model_kv_shape
from quant.scales.files import CalibrationData, Granularity, KVScales, Observer, ScalesMeta, convention_text

MSE_GRID: tuple[float, ...] = tuple(
    round(1.0 - 0.025 * i, 3) for i in range(32)
)  # clip factors 1.0 down to 0.225
KINDS = ("k", "v")


class CalibrationSpec(BaseModel):
    """What `calibrate` observes and how it turns observations into scales."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = "nvfp4"  # format whose decode convention the scales follow
    observer: Observer = "absmax"
    percentile: float = Field(default=99.99, gt=0.0, le=100.0)  # percentile observer only
    granularity: Granularity = "tensor"
    n_samples: int = Field(default=32, ge=1)
    seq_len: int = Field(default=512, ge=2)
    batch_size: int = Field(default=4, ge=1)
    mse_max_tokens: int = Field(default=8192, ge=1)  # mse: tokens (evenly strided) the error is measured on
    seed: int = 0


def token_chunks(token_ids: Sequence[int], n_samples: int, seq_len: int, seed: int) -> torch.Tensor:
    """n_samples non-overlapping windows [n, seq_len] of a token stream, seeded choice, in stream order.

    Fewer windows are returned when the stream holds fewer than n_samples full windows.
    """
    ids = torch.as_tensor(list(token_ids), dtype=torch.int64)
    available = ids.numel() // seq_len
    if available == 0:
        raise QuantError(
            f"calibration data has {ids.numel()} tokens, fewer than one sample of seq_len {seq_len}"
        )
    windows = ids[: available * seq_len].reshape(available, seq_len)  # [available, seq_len]
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randperm(available, generator=gen)[: min(n_samples, available)].sort().values
    return windows[pick]


def tokenize_texts(tokenizer, texts: Sequence[str], separator: str = "\n\n") -> list[int]:
    """Token ids of the texts joined by `separator` (no special tokens added)."""
    joined = separator.join(t for t in texts if t)
    return list(tokenizer(joined, add_special_tokens=False)["input_ids"])


def chunks_sha256(chunks: torch.Tensor) -> str:
    """sha256 of the token ids used (int64, little-endian, row-major)."""
    return hashlib.sha256(chunks.to(torch.int64).contiguous().numpy().astype("<i8").tobytes()).hexdigest()


def _per_group(x: torch.Tensor, by_head: bool) -> torch.Tensor:
    """|x| [B, H, T, D] flattened per head [H, B*T*D] or all together [1, B*H*T*D], float32."""
    a = x.detach().abs().to(torch.float32)
    if by_head:
        return a.transpose(0, 1).reshape(a.shape[1], -1)
    return a.reshape(1, -1)


class _Absmax:
    """Running max of |x| per layer and kind, per group (head or whole tensor)."""

    def __init__(self, by_head: bool) -> None:
        self.by_head = by_head
        self.amax: dict[tuple[int, str], torch.Tensor] = {}

    def __call__(self, layer: int, kind: str, x: torch.Tensor) -> None:
        m = _per_group(x, self.by_head).amax(dim=-1)  # [G]
        old = self.amax.get((layer, kind))
        self.amax[(layer, kind)] = m if old is None else torch.maximum(old, m)

    def result(self, layer: int, kind: str) -> torch.Tensor:
        return self.amax[(layer, kind)]


class _Percentile:
    """Exact inverted-CDF percentile of |x| from the top-k values, k = M - ceil(M * p / 100) + 1."""

    def __init__(self, by_head: bool, percentile: float, total_per_group: Mapping[str, int]) -> None:
        """`total_per_group`: values one group sees over the run, per kind (K and V differ in width on MLA)."""
        self.by_head = by_head
        self.ks = {kind: max(1, m - math.ceil(m * percentile / 100.0) + 1) for kind, m in total_per_group.items()}
        self.top: dict[tuple[int, str], torch.Tensor] = {}

    def __call__(self, layer: int, kind: str, x: torch.Tensor) -> None:
        a = _per_group(x, self.by_head)  # [G, N]
        old = self.top.get((layer, kind))
        cand = a if old is None else torch.cat([old, a], dim=-1)
        k = min(self.ks[kind], cand.shape[-1])
        self.top[(layer, kind)] = torch.topk(cand, k, dim=-1, sorted=False).values

    def result(self, layer: int, kind: str) -> torch.Tensor:
        top = self.top[(layer, kind)]
        if top.shape[-1] < self.ks[kind]:
            raise QuantError(
                "percentile observer saw fewer values than expected; the token count changed mid-run"
            )
        return top.amin(dim=-1)  # the k-th largest = the percentile


class _MSE:
    """Squared reconstruction error of the format for every clip factor c * amax, per group."""

    def __init__(
        self, fmt: KVFormat, by_head: bool, amax: _Absmax, grid: Sequence[float], stride: int
    ) -> None:
        self.fmt = fmt
        self.stride = stride  # every stride-th token of each sequence: bounds the cost of 32 trial runs
        self.by_head = by_head
        self.amax = amax
        self.grid = torch.tensor(grid, dtype=torch.float32)  # [C]
        self.sse: dict[tuple[int, str], torch.Tensor] = {}

    def __call__(self, layer: int, kind: str, x: torch.Tensor) -> None:
        xf = x.detach()[:, :, :: self.stride, :].to(torch.float32).contiguous()  # [B, H, T / stride, D]
        amax = self.amax.result(layer, kind)  # [G]
        clip = self.grid[:, None] * amax[None, :]  # [C, G]
        d = self.fmt.decode_scale_from_amax(clip)  # [C, G]
        d = d.reshape(len(self.grid), 1, -1, 1, 1)  # [C, 1, G, 1, 1]: G = H (per head) or 1
        xc = xf.unsqueeze(0).expand(len(self.grid), *xf.shape)  # [C, B, H, T, D]
        err = (self.fmt.dequantize(self.fmt.quantize(xc, d)) - xc).square()  # [C, B, H, T, D]
        sse = err.sum(dim=(1, 3, 4)) if self.by_head else err.sum(dim=(1, 2, 3, 4)).unsqueeze(-1)  # [C, G]
        old = self.sse.get((layer, kind))
        self.sse[(layer, kind)] = sse if old is None else old + sse

    def result(self, layer: int, kind: str) -> tuple[torch.Tensor, list[int]]:
        """(chosen clip value [G], grid index per group); ties go to the larger factor (earlier in grid)."""
        best = self.sse[(layer, kind)].argmin(dim=0)  # [G]
        return self.grid[best] * self.amax.result(layer, kind), best.tolist()


def _run(
    model, chunks: torch.Tensor, batch_size: int, observe: Callable[[int, str, torch.Tensor], None]
) -> None:
    def observer(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        observe(layer, "k", k)
        observe(layer, "v", v)

    device = next(model.parameters()).device
    with torch.no_grad():
        for start in range(0, chunks.shape[0], batch_size):
            batch = chunks[start : start + batch_size].to(device)  # [b, seq_len]
            model(input_ids=batch, cache=ObservingCache(model.config, observer), use_cache=True)


def calibrate(
    model, chunks: torch.Tensor, spec: CalibrationSpec, *, data_name: str, model_name: str
) -> KVScales:
    """Observe K/V of `model` on token chunks [n, seq_len]; scales per spec.observer and granularity."""
    fmt = get_format(spec.format)
    if not fmt.needs_tensor_scale:
        raise QuantError(
            f"format {fmt.name!r} has no per-tensor scale to calibrate; use nvfp4, nvfp4_4over6 or fp8"
        )
    shape = model_kv_shape(model.config)
    num_layers, heads = len(shape.layer_types), shape.num_kv_heads
    by_head = spec.granularity == "head"
    model.eval()
    absmax = _Absmax(by_head)
    clip_factors: dict[str, list[float]] | None = None
    stride: int | None = None
    if spec.observer == "percentile":
        per_row = chunks.numel() * (1 if by_head else heads)
        widths = {"k": shape.k_head_dim, "v": shape.v_head_dim}  # unequal on MLA (latent vs rope key)
        obs = _Percentile(by_head, spec.percentile, {kind: per_row * widths[kind] for kind in KINDS})
        _run(model, chunks, spec.batch_size, obs)
        amax = {(i, kind): obs.result(i, kind) for i in range(num_layers) for kind in KINDS}
    else:
        _run(model, chunks, spec.batch_size, absmax)
        amax = {(i, kind): absmax.result(i, kind) for i in range(num_layers) for kind in KINDS}
        if spec.observer == "mse":
            stride = math.ceil(chunks.numel() / spec.mse_max_tokens)
            mse = _MSE(fmt, by_head, absmax, MSE_GRID, stride)
            _run(model, chunks, spec.batch_size, mse)
            clip_factors = {"k": [], "v": []}
            for i in range(num_layers):
                for kind in KINDS:
                    amax[(i, kind)], best = mse.result(i, kind)
                    clip_factors[kind].extend(MSE_GRID[j] for j in best)
    missing = [i for i in range(num_layers) if (i, "k") not in amax]
    if missing:
        raise QuantError(f"layers {missing} wrote no K/V during calibration; is this a decoder-only model?")
    # an all-zero layer has no scale to calibrate: fall back to amax 1.0 (any scale stores zeros exactly)
    stacked = {kind: torch.stack([amax[(i, kind)] for i in range(num_layers)]) for kind in KINDS}  # [L, G]
    stacked = {kind: torch.where(t > 0, t, 1.0) for kind, t in stacked.items()}
    if not by_head:
        stacked = {kind: t[:, 0] for kind, t in stacked.items()}  # [L]
    meta = ScalesMeta(
        format=fmt.name,
        convention=convention_text(fmt.name),
        observer=spec.observer,
        percentile=spec.percentile if spec.observer == "percentile" else None,
        mse_clip_k=clip_factors["k"] if clip_factors else None,
        mse_clip_v=clip_factors["v"] if clip_factors else None,
        mse_token_stride=stride,
        granularity=spec.granularity,
        num_layers=num_layers,
        num_kv_heads=heads,
        model=model_name,
        data=CalibrationData(
            name=data_name,
            sha256=chunks_sha256(chunks),
            n_samples=int(chunks.shape[0]),
            seq_len=int(chunks.shape[1]),
        ),
        seed=spec.seed,
    )
    return KVScales(
        k_amax=stacked["k"].contiguous(),
        v_amax=stacked["v"].contiguous(),
        k_scale=fmt.decode_scale_from_amax(stacked["k"]).contiguous(),
        v_scale=fmt.decode_scale_from_amax(stacked["v"]).contiguous(),
        meta=meta,
    )
