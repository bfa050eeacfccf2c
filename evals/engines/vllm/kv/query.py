"""The query and output rounding of the qa_kv plugin: Q rounded to FP8 E4M3 before attention reads it, and
the attention output rounded to FP8 E4M3, as vLLM's native SM100 NVFP4 path does (spec `query_format` /
`output_format`, quant.kv.spec).

vLLM 0.32 v1/attention/backends/flashinfer.py, with an NVFP4 cache on trtllm-gen (SM100): `get_q_data_type`
gives FP8 E4M3 and `maybe_quant_query` quantizes Q with `scaled_fp8_quant(query, scale=layer._q_scale)`
(fp8(q / q_scale), saturating at 448; q_scale 1.0 unless the checkpoint has one), folding q_scale into
bmm1_scale; the kernel writes its output into an FP8 E4M3 buffer (`_nvfp4_fp8_out`, o scale 1.0 unless an
attention + quant fusion gives one) that is then copied into the model-dtype output. Here both become values
in the model dtype: fp8(q / s) * s and fp8(o). On FlashInfer FA2 (SM80 / SM90 / SM120) Q and the output stay
in the model dtype, so neither option applies there.

Installed on the layer's backend instance (`impl.forward`), after the K/V rewrite: plain torch ops on the
tensors vLLM hands over, the scale a Python float read once at install; no host read, no allocation of a
constant, no data-dependent branch per call. Torch only, no vllm.
"""

from __future__ import annotations

from typing import Any

import torch

from quant.formats.minifloat import F8_E4M3_MAX
from quant.kv.spec import KVQuantSpec


def fp8_e4m3_values(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """x as FP8 E4M3 holds it at decode scale `scale` (fp8(x / scale) saturating, round to nearest even),
    read back times `scale`, in x's dtype; NaN stays NaN."""
    y = x.to(torch.float32)
    if scale != 1.0:
        y = y / scale
    q = y.clamp(-F8_E4M3_MAX, F8_E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    return (q * scale if scale != 1.0 else q).to(x.dtype)


def io_refusal(spec: KVQuantSpec, mla: bool) -> str | None:
    """Why the plugin cannot round this layer's Q / output as `spec` asks (one clause), None when it can."""
    wanted = [k for k in ("query_format", "output_format") if getattr(spec, k) is not None]
    if wanted and mla:
        return (f"{wanted[0]}: an MLA layer's attention reads Q through its own absorbed projections, which the "
                "plugin does not round; drop it for this model")
    return None


def install_io_rounding(layer: Any, spec: KVQuantSpec) -> bool:
    """Round Q (query_format) and the output (output_format) in one `Attention` layer's backend forward;
    False (nothing installed) when the spec asks for neither. Q's scale: the layer's `_q_scale_float`."""
    if spec.query_format is None and spec.output_format is None:
        return False
    impl = layer.impl
    forward = impl.forward
    q_scale = float(getattr(layer, "_q_scale_float", 1.0))
    round_q, round_out = spec.query_format is not None, spec.output_format is not None

    def forward_rounded(attn: Any, query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if round_q:
            query = fp8_e4m3_values(query, q_scale)
        out = forward(attn, query, *args, **kwargs)
        if round_out:
            out.copy_(fp8_e4m3_values(out))  # the output buffer vLLM passed in, rounded in place
        return out

    impl.forward = forward_rounded
    return True
