"""evals.provenance.record.KVProvenance.bytes_per_token: each layer's format on the geometry it recorded, by
quant.formats.catalog's definitions; unknown without every layer's geometry."""

from __future__ import annotations

from evals.provenance.record import KVProvenance, LayerScales
from quant.formats.catalog import kv_bytes_per_token


def _prov(formats: list[str], geometry: tuple[int, int] | None) -> KVProvenance:
    heads, dim = geometry if geometry is not None else (None, None)
    layers = [LayerScales(layer=i, format=f, k_scale=[], v_scale=[], num_kv_heads=heads, head_size=dim)
              for i, f in enumerate(formats)]
    return KVProvenance(source="vllm-offline", kv_dtype="nvfp4", scales_origin="dynamic", layers=layers)


def test_bytes_per_token_sums_each_layers_format_against_the_16_bit_cache() -> None:
    prov = _prov(["nvfp4", "none", "turboquant_4bit_nc"], (3, 64))
    want = sum(kv_bytes_per_token(f, 64, 3) for f in ("nvfp4", "none", "turboquant_4bit_nc"))
    assert prov.bytes_per_token() == (want, 3 * kv_bytes_per_token("none", 64, 3))
    assert prov.bytes_per_token()[1] == 3 * 3 * 64 * 2 * 2  # layers x heads x (K + V) x D x 2 bytes


def test_bytes_per_token_is_unknown_without_the_geometry() -> None:
    assert _prov(["nvfp4"], None).bytes_per_token() is None
    assert _prov([], (3, 64)).bytes_per_token() is None
