"""Element codecs shared by the block formats: FP4 E2M1 codes, FP8 E4M3 / E8M0 scale bytes, nibble packing.

E2M1 (OCP MX spec, sec. 5.3.3): 1 sign, 2 exponent (bias 1), 1 mantissa bit; no Inf/NaN. Its eight
magnitudes are {0, 0.5, 1, 1.5, 2, 3, 4, 6}; the code of a magnitude is its index in that list and
bit 3 is the sign. Rounding is to nearest, ties to even code, saturating at 6.
"""

from __future__ import annotations

import torch

from quant.errors import QuantError

F4_E2M1_MAX = 6.0  # 2**(3 - 1) * (1 + 1/2): largest exponent 0b11 (bias 1), mantissa 0b1
F8_E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max: 2**8 * 1.75 (0b1111 exponent, 0b110 mantissa)
F8_E4M3_MIN_SUBNORMAL = 2.0**-9  # 2**(1 - 7) * 2**-3: exponent bias 7, three mantissa bits
F8_E5M2_MAX = 57344.0  # torch.finfo(torch.float8_e5m2).max: 2**15 * 1.75
E8M0_BIAS = 127  # OCP MX spec: scale = 2**(byte - 127); byte 255 is NaN

E2M1_SIGN_BIT = 0x8
# magnitude of every 3-bit E2M1 code, index = code
E2M1_MAGNITUDES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# value of every 4-bit E2M1 code (codes 8..15 are the negatives, code 8 is -0.0)
E2M1_VALUES: tuple[float, ...] = E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES)

_LUT_CACHE: dict[torch.device, torch.Tensor] = {}


def e2m1_lut(device: torch.device) -> torch.Tensor:
    """The 16 E2M1 code values as a float32 lookup table on `device` (index = 4-bit code)."""
    lut = _LUT_CACHE.get(device)
    if lut is None:
        lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
        _LUT_CACHE[device] = lut
    return lut


# E2M1 decision points on |y| (ties to even): at a "strict" point the code stays down, at an
# "inclusive" one it goes up; the magnitude code is the number of points passed.
E2M1_STRICT_POINTS = (0.25, 1.25, 2.5, 5.0)  # ties 0 | 0.5, 1 | 1.5, 2 | 3, 4 | 6 go down
E2M1_INCLUSIVE_POINTS = (0.75, 1.75, 3.5)  # ties 0.5 | 1, 1.5 | 2, 3 | 4 go up


# bucketize boundaries giving the same count: an inclusive point t becomes the float just below it
_BUCKET_CACHE: dict[torch.device, torch.Tensor] = {}
# below this many elements the one-op bucketize beats the 7 compares (per-op overhead dominates)
SMALL_ENCODE_NUMEL = 1 << 15


def _e2m1_boundaries(device: torch.device) -> torch.Tensor:
    bounds = _BUCKET_CACHE.get(device)
    if bounds is None:
        strict = torch.tensor(E2M1_STRICT_POINTS, dtype=torch.float32)
        inclusive = torch.tensor(E2M1_INCLUSIVE_POINTS, dtype=torch.float32)
        below = torch.nextafter(inclusive, torch.zeros_like(inclusive))
        bounds = torch.cat((strict, below)).sort().values.to(device)
        _BUCKET_CACHE[device] = bounds
    return bounds


def e2m1_encode(y: torch.Tensor, *, sign_from_bit: bool = False) -> torch.Tensor:
    """Round float32 `y` to E2M1 codes (uint8 0..15, same shape): nearest, ties to even, saturating at 6.

    The magnitude code counts the decision points |y| has passed (anything above 5 is code 7, so
    saturation is free): 7 in-place compares for large tensors, one bucketize for small ones (the
    two agree exactly; tests check it). The sign bit is `y < 0`, as in FlashInfer's reference: a
    negative value that rounds to zero gets code 8 (-0), while -0.0 itself gets code 0.
    `sign_from_bit=True` copies the float sign bit instead (-0.0 -> code 8), as torchao's MX casts do.
    """
    a = y.abs()
    negative = torch.signbit(y) if sign_from_bit else torch.lt(y, 0.0)
    if a.numel() < SMALL_ENCODE_NUMEL:
        mag = torch.bucketize(a, _e2m1_boundaries(a.device), out_int32=True)  # #{b : b < a}
        return (mag + negative * E2M1_SIGN_BIT).to(torch.uint8)
    return _count_points(a).add_(negative.view(torch.uint8), alpha=E2M1_SIGN_BIT)


def e2m1_encode_(y: torch.Tensor) -> torch.Tensor:
    """`e2m1_encode(y)` that may overwrite y (a scratch float32 tensor the caller owns) to save a copy."""
    if y.numel() < SMALL_ENCODE_NUMEL:
        return e2m1_encode(y)
    negative = torch.lt(y, 0.0)
    return _count_points(y.abs_()).add_(negative.view(torch.uint8), alpha=E2M1_SIGN_BIT)


def _count_points(a: torch.Tensor) -> torch.Tensor:
    """uint8 count of E2M1 decision points passed by |y| = a (the large-tensor path of e2m1_encode)."""
    mag = torch.gt(a, E2M1_STRICT_POINTS[0]).view(torch.uint8)  # bool and uint8 share the 0/1 byte
    passed = torch.empty_like(a, dtype=torch.bool)
    for point in E2M1_STRICT_POINTS[1:]:
        mag.add_(torch.gt(a, point, out=passed).view(torch.uint8))
    for point in E2M1_INCLUSIVE_POINTS:
        mag.add_(torch.ge(a, point, out=passed).view(torch.uint8))
    return mag


def e2m1_decode_packed(packed: torch.Tensor) -> torch.Tensor:
    """Float32 values [..., 2K] of packed E2M1 bytes [..., K] (element 2i from the low nibble)."""
    pairs = torch.nn.functional.embedding(packed.int(), e2m1_pair_lut(packed.device))  # [..., K, 2]
    return pairs.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


_PAIR_LUT_CACHE: dict[torch.device, torch.Tensor] = {}


def e2m1_pair_lut(device: torch.device) -> torch.Tensor:
    """float32 [256, 2]: the (low nibble, high nibble) E2M1 values of every byte."""
    lut = _PAIR_LUT_CACHE.get(device)
    if lut is None:
        values = e2m1_lut(device)
        lut = torch.stack((values.repeat(16), values.repeat_interleave(16)), dim=-1)  # byte = lo + 16 * hi
        _PAIR_LUT_CACHE[device] = lut
    return lut


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Values (float32) of E2M1 codes (uint8 0..15)."""
    return e2m1_lut(codes.device)[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pack uint8 codes [..., K] (K even) into bytes [..., K/2]: element 2i low nibble, 2i+1 high."""
    if codes.shape[-1] % 2:
        raise QuantError(f"cannot pack {codes.shape[-1]} nibbles: the last dimension must be even")
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)  # [..., K/2, 2]
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Unpack bytes [..., K/2] into uint8 codes [..., K] (inverse of `pack_nibbles`)."""
    pairs = torch.stack((packed & 0x0F, packed >> 4), dim=-1)  # [..., K/2, 2]
    return pairs.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """Round non-negative float32 `x` to the nearest E4M3 value (ties to even, saturating at 448), as float32."""
    return x.clamp(max=F8_E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def e4m3_to_bytes(x: torch.Tensor) -> torch.Tensor:
    """Raw E4M3 bytes (uint8) of float32 values already on the E4M3 grid."""
    return x.to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_from_bytes(b: torch.Tensor) -> torch.Tensor:
    """Float32 values of raw E4M3 bytes (uint8)."""
    return b.view(torch.float8_e4m3fn).to(torch.float32)


def e8m0_from_bytes(b: torch.Tensor) -> torch.Tensor:
    """Float32 values 2**(b - 127) of E8M0 scale bytes (uint8); byte 255 (NaN) never occurs here."""
    # exponent field b << 23 is the float32 2**(b - 127) for b in 1..254; b == 0 is 2**-127 (subnormal)
    normal = (b.to(torch.int32) << 23).view(torch.float32)
    return torch.where(b == 0, torch.tensor(2.0**-127, device=b.device), normal)
