"""kv-inspect: how much a KV-cache configuration distorts K, V and attention, layer by layer.

One plain forward per prompt captures, per layer, the K (after RoPE) and V written to the cache and the
inputs and output of the attention module. Then, per layer:
- K and V are written to a fresh emulated cache of the given spec; the dequantized values it hands to
  attention are compared with the originals: SQNR = 10 log10(sum x^2 / sum (x^ - x)^2) in dB and the
  relative error ||x^ - x|| / ||x||, summed over all prompts;
- underflow share: 16-element blocks (along head_dim) that are not all zero but come back all zero;
  saturation share: blocks whose amax exceeds what the decode scale can represent (amax / d greater
  than the format's largest value over d, e.g. 448 * 6 for NVFP4), for formats with a tensor scale;
  both measured on the layer's main format and scale;
- attention relative error: the attention module re-run on the *same* inputs with the quantized cache,
  ||o^ - o|| / ||o||, so each layer's number is its own, not the accumulated error of earlier layers.
Prefill always reads the quantized cache here (that is what is being inspected).

kv_inspect.json is the one file format of these numbers (`InspectReport`, versioned by
`schema_version`; the schema and its I/O live in quant.kv.inspect_report, torch-free, re-exported here):
`report = inspect_kv(model, prompts, spec)`, then `save_inspect(path, report)` (atomic) and, in
whatever reads it, `load_inspect(path)` (a one-line QuantError naming the path when the file is missing
or not a valid report). `qa kv-inspect --json` prints the same JSON. An exact reconstruction's SQNR is
inf, written as the JSON constant Infinity. Its per-layer plot is drawn by
`qa.report.plots.kv_error_plot` (the report and `qa kv-inspect --plot`).
"""

from __future__ import annotations

import math

import torch

from quant.errors import QuantError
from quant.kv.cache import make_cache
from quant.kv.inspect_report import (  # noqa: F401 - the schema and its I/O, re-exported for existing callers
    INSPECT_SCHEMA_VERSION,
    InspectReport,
    KindStats,
    LayerReport,
    load_inspect,
    save_inspect,
)
from quant.kv.layer import QuantizedKVLayer
from quant.kv.observe import ObservingCache
from quant.kv.shape import model_kv_shape
from quant.kv.spec import KVQuantSpec
from quant.scales.files import KVScales

BLOCK = 16  # elements per block for the underflow / saturation shares (NVFP4's scale block)
CACHE_KWARGS = (
    "cache",
    "past_key_values",
    "past_key_value",
)  # the cache argument's name across transformers versions


class _Acc:
    """Sums for SQNR / relative error and block counts."""

    def __init__(self) -> None:
        self.signal = 0.0
        self.noise = 0.0
        self.blocks = 0
        self.underflow = 0
        self.saturated = 0
        self.amax = 0.0

    def stats(self) -> KindStats:
        sqnr = (
            math.inf
            if self.noise == 0
            else 10.0 * math.log10(self.signal / self.noise)
            if self.signal
            else -math.inf
        )
        rel = math.sqrt(self.noise / self.signal) if self.signal else 0.0
        return KindStats(
            sqnr_db=sqnr,
            rel_error=rel,
            underflow_share=self.underflow / max(self.blocks, 1),
            saturation_share=self.saturated / max(self.blocks, 1),
            amax=self.amax,
        )


def _attention_modules(model) -> dict[int, torch.nn.Module]:
    found = {
        int(m.layer_idx): m
        for name, m in model.named_modules()
        if name.endswith("self_attn") and isinstance(getattr(m, "layer_idx", None), int)
    }
    if not found:
        raise QuantError(
            f"cannot find the attention modules (`*.self_attn` with a layer_idx) of {type(model).__name__}"
        )
    return found


def _block_counts(
    x: torch.Tensor, xhat: torch.Tensor, d: torch.Tensor | None, limit: float | None
) -> tuple[int, int, int]:
    """(blocks, underflowed, saturated) over 16-element blocks of x [B, H, T, D] and its reconstruction."""
    xb = x.to(torch.float32).reshape(*x.shape[:-1], -1, BLOCK)  # [B, H, T, D/16, 16]
    hb = xhat.to(torch.float32).reshape(*xhat.shape[:-1], -1, BLOCK)
    amax = xb.abs().amax(dim=-1)  # [B, H, T, D/16]
    under = (amax > 0) & (hb.abs().amax(dim=-1) == 0)
    if d is None or limit is None:
        saturated = torch.zeros_like(under)
    else:
        saturated = amax / d > limit  # d: () or [B|1, H|1, 1, 1], broadcasts over [B, H, T, D/16]
    return amax.numel(), int(under.sum()), int(saturated.sum())


def _capture(
    model, ids: torch.Tensor
) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], dict[int, tuple]]:
    kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    calls: dict[int, tuple] = {}

    def observe(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        kv[layer] = (k.detach().clone(), v.detach().clone())

    hooks = []
    for i, module in _attention_modules(model).items():

        def hook(mod, args, kwargs, output, i=i):
            calls[i] = (args, dict(kwargs), output[0].detach().clone())

        hooks.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(input_ids=ids, cache=ObservingCache(model.config, observe), use_cache=True)
    finally:
        for h in hooks:
            h.remove()
    return kv, calls


def inspect_kv(
    model, prompts: torch.Tensor, spec: KVQuantSpec, scales: KVScales | None = None, model_name: str = ""
) -> InspectReport:
    """Per-layer K/V reconstruction and attention error of `spec` on prompts [n, T] (a forward each)."""
    spec = spec.model_copy(update={"prefill_reads_quantized": True})
    model.eval()
    device = next(model.parameters()).device
    shape = model_kv_shape(model.config)  # QuantError for recurrent (hybrid) layers: every layer here has K/V
    layer_count = len(make_cache(model.config, spec, scales).layers)
    modules = _attention_modules(model)
    acc = {(i, kind): _Acc() for i in range(layer_count) for kind in "kv"}
    attn = {i: [0.0, 0.0] for i in range(layer_count)}  # [sum |o|^2, sum |o^ - o|^2]
    formats: dict[int, str] = {}
    for row in prompts:
        ids = row.unsqueeze(0).to(device)  # [1, T]
        kv, calls = _capture(model, ids)
        # one fresh cache for the stored K/V and one for the attention calls: each layer of a cache keeps its
        # own state and is written once here, so every layer starts empty
        cache, attn_cache = make_cache(model.config, spec, scales), make_cache(model.config, spec, scales)
        for i in range(layer_count):
            k, v = kv[i][0].contiguous(), kv[i][1].contiguous()
            layer: QuantizedKVLayer = cache.layers[i]
            formats[i] = layer.format
            with torch.no_grad():
                khat, vhat = layer.update(k, v)
            for kind, x, xhat, stream in (("k", k, khat, layer.k), ("v", v, vhat, layer.v)):
                a = acc[(i, kind)]
                xf, hf = x.to(torch.float32), xhat.to(torch.float32)
                a.signal += float(xf.square().sum())
                a.noise += float((hf - xf).square().sum())
                a.amax = max(a.amax, float(xf.abs().max()))
                fmt = stream.plan.fmt
                main_hat = fmt.dequantize(fmt.quantize(x.contiguous(), stream.scale), torch.float32)
                limit = (
                    float(1.0 / fmt.decode_scale_from_amax(torch.tensor(1.0)))
                    if fmt.needs_tensor_scale
                    else None
                )
                n, u, s = _block_counts(x, main_hat, stream.scale, limit)
                a.blocks += n
                a.underflow += u
                a.saturated += s
            if i in calls:
                args, kwargs, out = calls[i]
                key = next((name for name in CACHE_KWARGS if name in kwargs), "cache")
                with torch.no_grad():
                    qout = modules[i](*args, **{**kwargs, key: attn_cache})[0]
                attn[i][0] += float(out.to(torch.float32).square().sum())
                attn[i][1] += float((qout.to(torch.float32) - out.to(torch.float32)).square().sum())
    layers = [
        LayerReport(
            layer=i,
            format=formats[i],
            k=acc[(i, "k")].stats(),
            v=acc[(i, "v")].stats(),
            attn_rel_error=math.sqrt(attn[i][1] / attn[i][0]) if attn[i][0] else 0.0,
        )
        for i in range(layer_count)
    ]
    if scales is not None:
        label = f"static ({scales.meta.observer}, {scales.meta.data.name}, n={scales.meta.data.n_samples})"
    else:
        label = spec.scales if spec.scales != "constant" else f"constant {spec.constant_scale}"
    return InspectReport(
        model=model_name,
        spec=spec,
        scales=label,
        n_prompts=int(prompts.shape[0]),
        tokens_per_prompt=int(prompts.shape[1]),
        layers=layers,
        kv_heads=shape.num_kv_heads,
        k_head_dim=shape.k_head_dim,
        v_head_dim=shape.v_head_dim,
    )
