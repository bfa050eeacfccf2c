"""vLLM 0.32's own KV formats (per-token-head, TurboQuant, UltraQuant) against the bytes vLLM's kernels wrote.

The fixtures come from scripts/vllm_kv_kernels.py: vLLM's real Triton store kernels (and TurboQuant's and
UltraQuant's read-back kernels) run in Triton's interpreter on fixed seeded bfloat16 K and V [6 tokens,
2 heads, 64].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from quant.formats import turboquant as tq
from quant.formats import ultraquant as uq
from quant.formats import vllm_per_token_head as pth
from quant.formats.catalog import VLLM_FORMATS
from quant.formats.registry import get_format, kind_format

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_kv"
PER_TOKEN_HEAD = ("int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")
TURBOQUANT = tuple(tq.PRESETS)
ULTRAQUANT = ("ultraquant_4bit",)


def _load(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / f"{name}_bfloat16.npz") as z:
        return {k: z[k] for k in z.files}


def _bf16(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()


def test_fixtures_cover_every_vllm_format() -> None:
    assert set(VLLM_FORMATS) == set(PER_TOKEN_HEAD) | set(TURBOQUANT) | set(ULTRAQUANT)
    for name in VLLM_FORMATS:
        assert (FIXTURES / f"{name}_bfloat16.npz").stat().st_size < 10_000


@pytest.mark.parametrize("name", PER_TOKEN_HEAD)
def test_per_token_head_store_is_bit_exact(name: str) -> None:
    z = _load(name)
    fmt = get_format(name)
    for x, cache, scale in ((_bf16(z["key"]), "k_cache", "k_scale"), (_bf16(z["value"]), "v_cache", "v_scale")):
        q = fmt.quantize(x)
        codes = q.data["packed" if name.startswith("int4") else "codes"]
        np.testing.assert_array_equal(_bytes(codes), z[cache].view(np.uint8))
        np.testing.assert_array_equal(q.data["scales"][..., 0].numpy().view(np.uint32), z[scale].view(np.uint32))


def test_zero_row_takes_the_kernels_floor_scale() -> None:
    z = _load("int8_per_token_head")
    assert z["k_scale"][1, 0] == np.float32(1e-6)  # K of token 1, head 0 is all zeros in the fixture
    q = get_format("int8_per_token_head").quantize(_bf16(z["key"]))
    assert q.data["scales"][1, 0, 0].item() == np.float32(1e-6) and not q.data["codes"][1, 0].any()


def test_int4_rht_signs_are_vllms() -> None:
    np.testing.assert_array_equal(pth.rht_signs(64).numpy(), _load("int4_per_token_head")["rht_signs"])


def test_int4_zero_point_lives_in_the_scale_bits() -> None:
    z = _load("int4_per_token_head")
    scale, zp = pth.unpack_int4_scale(torch.from_numpy(z["k_scale"]))
    assert (zp >= 0).all() and (zp <= 15).all() and zp.unique().numel() > 1
    assert ((scale.view(torch.int32) & 0xF) == 0).all()


def test_int4_read_back_inverts_the_rotation() -> None:
    x = torch.randn(4, 3, 64, generator=torch.Generator().manual_seed(0))
    fmt = get_format("int4_per_token_head")
    back = fmt.dequantize(fmt.quantize(x))
    rotated = pth.single_rht(x) / 8.0  # orthonormal rotation: H (signs x) / sqrt(64)
    # the rotation is orthogonal up to sqrt(b), so the error in x's basis equals the rotated-basis error
    assert torch.allclose(pth.single_rht(pth.single_rht(x), inverse=True) / 64, x, atol=1e-5)
    err = (back - x).norm() / x.norm()
    assert 0.02 < err.item() < 0.15, err  # 4-bit asymmetric on Gaussian rows
    assert rotated.norm().item() == pytest.approx(x.norm().item(), rel=1e-5)


@pytest.mark.parametrize("name", TURBOQUANT)
def test_turboquant_slot_is_bit_exact(name: str) -> None:
    z = _load(name)
    fmt = get_format(name)
    qk = kind_format(fmt, "k").quantize(_bf16(z["key"]))
    qv = kind_format(fmt, "v").quantize(_bf16(z["value"]))
    parts = [t.contiguous().view(torch.uint8).reshape(6, 2, -1) for t in (*qk.data.values(), *qv.data.values())]
    slot = torch.cat(parts, dim=-1).numpy()  # [K bytes | V bytes | V scale fp16 | V zero fp16]
    assert slot.shape[-1] + slot.shape[-1] % 2 == z["slots"].shape[-1] == fmt.preset.slot_bytes(64)
    np.testing.assert_array_equal(slot, z["slots"][..., : slot.shape[-1]])


@pytest.mark.parametrize("name", TURBOQUANT)
def test_turboquant_codebook_is_vllms(name: str) -> None:
    p = tq.PRESETS[name]
    bits = p.value_bits if p.key_bits == 8 else p.key_bits  # vLLM's centroid_bits
    np.testing.assert_array_equal(tq.codebook(64, bits)[0].numpy(), _load(name)["centroids"])


@pytest.mark.parametrize("name", TURBOQUANT)
def test_turboquant_read_back_matches_vllms_dequant(name: str) -> None:
    z = _load(name)
    fmt = get_format(name)
    p = fmt.preset
    qk = kind_format(fmt, "k").quantize(_bf16(z["key"]))
    qv = kind_format(fmt, "v").quantize(_bf16(z["value"]))
    v = kind_format(fmt, "v").dequantize(qv).to(torch.float16)
    np.testing.assert_array_equal(v.view(torch.int16).numpy().view(np.uint16), z["v_read"])
    k_ref = torch.from_numpy(z["k_read"].view(np.int16).copy()).view(torch.float16).to(torch.float32)
    if p.key_bits == 8:
        k = kind_format(fmt, "k").dequantize(qk)
    else:
        k = tq.keys_rotated(qk.data, p.key_bits, 64, p.norm_correction)  # the kernel's rotated-basis K
    np.testing.assert_array_equal(k.to(torch.float16).to(torch.float32).numpy(), k_ref.numpy())


def test_turboquant_keys_read_back_in_the_original_basis() -> None:
    x = torch.randn(5, 2, 64, generator=torch.Generator().manual_seed(1))
    fmt = kind_format(get_format("turboquant_4bit_nc"), "k")
    err = (fmt.dequantize(fmt.quantize(x)) - x).norm() / x.norm()
    assert 0.03 < err.item() < 0.15, err  # 4-bit Lloyd-Max in the rotated basis, norm kept


def test_turboquant_v_slot_is_not_read_as_k() -> None:
    fmt = get_format("turboquant_4bit_nc")
    qv = kind_format(fmt, "v").quantize(torch.randn(2, 64))
    with pytest.raises(Exception, match="V slot read as K"):
        fmt.dequantize(qv)


def test_pack_bits_round_trips() -> None:
    idx = torch.randint(0, 8, (3, 64), generator=torch.Generator().manual_seed(2))
    for bits in (3, 4):
        codes = idx % (1 << bits)
        assert torch.equal(tq.unpack_bits(tq.pack_bits(codes, bits), bits, 64), codes)


def _ultraquant_store(z: dict[str, np.ndarray]) -> tuple[object, object]:
    fmt = get_format("ultraquant_4bit")
    return kind_format(fmt, "k").quantize(_bf16(z["key"])), kind_format(fmt, "v").quantize(_bf16(z["value"]))


def test_ultraquant_slot_is_bit_exact() -> None:
    z = _load("ultraquant_4bit")
    qk, qv = _ultraquant_store(z)
    parts = (qk.data["packed"], qk.data["scales"], qv.data["packed"], qv.data["scales"])
    slot = torch.cat(parts, dim=-1).numpy()  # [K codes | K UE8M0 | V codes | V UE8M0]
    assert slot.shape[-1] == z["slots"].shape[-1] == uq.slot_bytes(64) == 68
    np.testing.assert_array_equal(slot, z["slots"])


def test_ultraquant_read_back_matches_vllms_dequant() -> None:
    z = _load("ultraquant_4bit")
    qk, qv = _ultraquant_store(z)
    k_rot = uq.dequantize_groups(qk.data["packed"], qk.data["scales"])  # the kernel's rotated-basis K
    v = kind_format(get_format("ultraquant_4bit"), "v").dequantize(qv)
    for ours, theirs in ((k_rot, z["k_read"]), (v, z["v_read"])):
        assert torch.equal(ours.to(torch.bfloat16).float(), ours)  # code * 2**e is exact in bfloat16
        bits = ours.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        np.testing.assert_array_equal(bits, theirs)


def test_ultraquant_fixture_holds_the_corner_cases() -> None:
    z = _load("ultraquant_4bit")
    k_rot = uq.rotate(_bf16(z["key"]).float())
    v = _bf16(z["value"]).float()
    mids = torch.tensor(uq.MIDPOINTS)
    ties = saturated = 0
    for x in (k_rot, v):
        groups = x.reshape(6, 2, 2, 32)
        amax = groups.abs().amax(dim=-1, keepdim=True)
        s = torch.exp2(torch.floor(torch.log2(torch.where(amax > 0, amax * 0.156, 1.0)) + 0.5))
        y = groups / s
        ties += int((y.unsqueeze(-1) == mids).any(-1).sum())
        saturated += int((y.abs() > 5).sum())
    assert ties > 0 and saturated > 0  # ties going to the lower value, |y| > 5 read back as 6
    assert not z["slots"][1, 0, 32:34].any() and not z["slots"][1, 0, :32].any()  # K all zero: byte 0, code 0


def test_ultraquant_keys_read_back_in_the_original_basis() -> None:
    x = torch.randn(5, 2, 64, generator=torch.Generator().manual_seed(1))
    fmt = get_format("ultraquant_4bit")
    back = fmt.dequantize(fmt.quantize(x))
    rotated = uq.rotate(x)
    assert torch.allclose(uq.unrotate(rotated), x, atol=1e-5)  # the butterfly is x @ H_D / sqrt(D)
    err = (back - x).norm() / x.norm()
    assert 0.05 < err.item() < 0.2, err  # E2M1 with c = 0.156 power-of-two group scales


def test_ultraquant_refuses_head_dims_the_kernel_cannot_store() -> None:
    fmt = get_format("ultraquant_4bit")
    for d in (16, 48, 96):
        with pytest.raises(Exception, match="power of two >= 32"):
            fmt.quantize(torch.ones(2, d))


@pytest.mark.vllm
def test_ultraquant_agrees_with_vllms_reference() -> None:
    pytest.importorskip("vllm", reason="vLLM's PyTorch reference lives in vllm")
    from vllm.v1.attention.ops.ultraquant.reference import ultraquant_encode  # vllm: an extra check only

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 4, 128, generator=gen) * torch.exp(torch.randn(64, 4, 1, generator=gen))
    x = x.to(torch.bfloat16)
    fmt = get_format("ultraquant_4bit")
    for side in ("k", "v"):
        ref = ultraquant_encode(x, rotate=side == "k")  # K rotated by a float32 matmul, not the butterfly
        q = kind_format(fmt, side).quantize(x)
        assert torch.equal(q.data["scales"], ref.scale_bytes)
        assert torch.equal(q.data["packed"], ref.codes_packed)
