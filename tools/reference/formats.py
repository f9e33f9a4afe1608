"""Number formats and quantizers of spec section 7, bit-exact, on numpy arrays.

Every function takes and returns numpy arrays. "FP32" arrays are np.float32; BF16 values are
held as np.float32 arrays whose low 16 bits are zero (or as raw np.uint16 where stated).
Conversions that numpy lacks (BF16 rounding, E4M3, E2M1, UE8M0) are done on the integer bits.
"""

import numpy as np

F32 = np.float32
F64 = np.float64

INV448 = np.array([0x3B124925], dtype=np.uint32).view(F32)[0]   # fp32(1/448)
INV6 = np.array([0x3E2AAAAB], dtype=np.uint32).view(F32)[0]     # fp32(1/6)
assert INV448 == F32(1.0 / 448.0) and INV6 == F32(1.0 / 6.0)


# ---- 7.1 BF16 -------------------------------------------------------------------------------

def bf16_round(x):
    """FP32 -> nearest BF16 (round to nearest even on the low 16 bits), returned as FP32 values.
    NaN stays NaN (made quiet)."""
    x = np.ascontiguousarray(x, dtype=F32)
    u = x.view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) & 0xFFFF0000
    rounded = np.where(nan, (u | 0x00400000) & 0xFFFF0000, rounded).astype(np.uint32)
    return rounded.view(F32)


def bf16_from_bits(h):
    """Raw BF16 (uint16) -> FP32 values."""
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(F32)


def bf16_to_bits(x):
    """BF16 values held as FP32 (low bits zero) -> raw uint16."""
    return (np.ascontiguousarray(x, dtype=F32).view(np.uint32) >> 16).astype(np.uint16)


# ---- 7.2 FP8 E4M3 (e4m3fn) ------------------------------------------------------------------

def _e4m3_table():
    t = np.zeros(256, dtype=F64)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e = (c >> 3) & 0xF
        m = c & 7
        if e == 15 and m == 7:
            t[c] = np.nan
        elif e == 0:
            t[c] = s * m / 8.0 * 2.0 ** -6
        else:
            t[c] = s * (1 + m / 8.0) * 2.0 ** (e - 7)
    return t


E4M3_TABLE64 = _e4m3_table()
E4M3_TABLE = E4M3_TABLE64.astype(F32)


def e4m3_decode(codes):
    return E4M3_TABLE[np.asarray(codes, dtype=np.uint8)]


def e4m3_encode(x):
    """FP32 -> E4M3 code: saturate to +-448, then round to nearest even (subnormals included).
    NaN -> 0x7F with the sign kept."""
    x = np.ascontiguousarray(x, dtype=F32)
    u = x.view(np.uint32)
    sign = ((u >> 24) & 0x80).astype(np.uint8)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    a = np.minimum(np.abs(x), F32(448.0))
    ua = a.view(np.uint32)
    # normals (|a| >= 2^-6): keep 3 mantissa bits of the FP32 pattern, RNE on the 20 dropped bits,
    # then rebias the exponent from 127 to 7 (120 << 3 in code units).
    r = (ua + (0x7FFFF + ((ua >> 20) & 1))) >> 20
    normal = (r.astype(np.int64) - (120 << 3))
    # subnormals (|a| < 2^-6): code = RNE(a * 2^9), an integer 0..8 (8 is the smallest normal)
    with np.errstate(invalid="ignore"):
        sub = np.rint(np.where(nan, F32(0), a) * F32(512.0)).astype(np.int64)
    mag = np.where(a < F32(2.0 ** -6), sub, normal)
    code = (mag.astype(np.uint8) | sign)
    return np.where(nan, sign | 0x7F, code).astype(np.uint8)


# ---- 7.3 UE8M0 and E2M1 ---------------------------------------------------------------------

def ue8m0_decode(e):
    e = np.asarray(e, dtype=np.uint8)
    with np.errstate(over="ignore"):
        v = np.ldexp(np.ones(e.shape, dtype=F64), e.astype(np.int64) - 127).astype(F32)
    return np.where(e == 255, F32(np.nan), v).astype(F32)


E2M1_MAG = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F32)
E2M1_TABLE = np.concatenate([E2M1_MAG, -E2M1_MAG]).astype(F32)
E2M1_TABLE64 = E2M1_TABLE.astype(F64)


def e2m1_encode(x):
    """FP32 -> 4-bit E2M1 code (bit 3 = sign of the input). Clamps to +-6, then nearest magnitude,
    ties to the even code (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4)."""
    x = np.asarray(x, dtype=F32)
    a = np.minimum(np.abs(x), F32(6.0))
    code = ((a > F32(0.25)).astype(np.uint8) + (a >= F32(0.75)) + (a > F32(1.25))
            + (a >= F32(1.75)) + (a > F32(2.5)) + (a >= F32(3.5)) + (a > F32(5.0)))
    return (code.astype(np.uint8) | (np.signbit(x).astype(np.uint8) << 3)).astype(np.uint8)


def e2m1_decode(codes):
    return E2M1_TABLE[np.asarray(codes, dtype=np.uint8) & 15]


def e2m1_pack(codes):
    """[..., 2n] codes -> [..., n] bytes; even element in the low nibble."""
    codes = np.asarray(codes, dtype=np.uint8)
    return (codes[..., 0::2] & 15) | ((codes[..., 1::2] & 15) << 4)


def e2m1_unpack(packed):
    packed = np.asarray(packed, dtype=np.uint8)
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 15
    out[..., 1::2] = packed >> 4
    return out


# ---- 7.4 quantizers -------------------------------------------------------------------------

def pow2ceil(a, inv):
    """t = fp32(a * inv); 2^(E - 127 + (M != 0)) from t's bits (t is normal here)."""
    t = np.ascontiguousarray(np.asarray(a, dtype=F32) * F32(inv), dtype=F32)
    u = t.view(np.uint32)
    e = ((u >> 23) & 0xFF) + ((u & 0x7FFFFF) != 0)
    return (e.astype(np.uint32) << 23).view(F32)


def _log2_pow2(s):
    """Biased exponent byte of a power-of-two FP32 (the UE8M0 code)."""
    return ((np.ascontiguousarray(s, dtype=F32).view(np.uint32) >> 23) & 0xFF).astype(np.uint8)


def _groups(x, g):
    x = np.asarray(x, dtype=F32)
    assert x.shape[-1] % g == 0, "last dim %d not a multiple of %d" % (x.shape[-1], g)
    return x.reshape(x.shape[:-1] + (x.shape[-1] // g, g))


def q8_quant(x):
    """Q8: groups of 32, E4M3 codes and UE8M0 scale bytes. x: BF16 values [..., n]."""
    xg = _groups(x, 32)
    a = np.maximum(np.max(np.abs(xg), axis=-1), F32(1e-4))
    s = pow2ceil(a, INV448)
    q = e4m3_encode(np.clip(xg / s[..., None], F32(-448.0), F32(448.0)))
    return q.reshape(np.shape(x)), _log2_pow2(s)


def q8_dequant(codes, scale_bytes):
    cg = codes.reshape(codes.shape[:-1] + (codes.shape[-1] // 32, 32))
    v = e4m3_decode(cg) * ue8m0_decode(scale_bytes)[..., None]
    return bf16_round(v.reshape(codes.shape))


def q8_qdq(x):
    return q8_dequant(*q8_quant(x))


def q4mx_quant(x):
    """Q4mx (MXFP4): groups of 32, E2M1 codes (unpacked) and UE8M0 scale bytes."""
    xg = _groups(x, 32)
    a = np.maximum(np.max(np.abs(xg), axis=-1), F32(6.0 * 2.0 ** -126))
    s = pow2ceil(a, INV6)
    v = np.clip(xg / s[..., None], F32(-6.0), F32(6.0))
    return e2m1_encode(v).reshape(np.shape(x)), _log2_pow2(s)


def q4mx_dequant(codes, scale_bytes):
    cg = codes.reshape(codes.shape[:-1] + (codes.shape[-1] // 32, 32))
    v = e2m1_decode(cg) * ue8m0_decode(scale_bytes)[..., None]
    return bf16_round(v.reshape(codes.shape))


def q4mx_qdq(x):
    return q4mx_dequant(*q4mx_quant(x))


def q4nv_quant(x):
    """Q4nv (NVFP4 without a global scale): groups of 16, E2M1 codes (unpacked) and E4M3 scale
    codes. The scale is e4m3(clamp(amax / 6)) with a true FP32 division."""
    xg = _groups(x, 16)
    a = np.maximum(np.max(np.abs(xg), axis=-1), F32(6.0 * 2.0 ** -9))
    sc = e4m3_encode(np.clip(a / F32(6.0), F32(-448.0), F32(448.0)))
    s = e4m3_decode(sc)
    v = np.clip(xg / s[..., None], F32(-6.0), F32(6.0))
    return e2m1_encode(v).reshape(np.shape(x)), sc


def q4nv_dequant(codes, scale_codes):
    cg = codes.reshape(codes.shape[:-1] + (codes.shape[-1] // 16, 16))
    v = e2m1_decode(cg) * e4m3_decode(scale_codes)[..., None]
    return bf16_round(v.reshape(codes.shape))


def q4nv_qdq(x):
    return q4nv_dequant(*q4nv_quant(x))


# ---- packed cache records (spec 6.1) --------------------------------------------------------

def pack_main_kv(codes, scales):
    """main KV entry: d/2 packed E2M1 bytes + d/16 E4M3 scale bytes."""
    return np.concatenate([e2m1_pack(codes), scales], axis=-1).astype(np.uint8)


def pack_index_k(codes, scales):
    """index K entry: d/2 packed E2M1 bytes + d/32 UE8M0 bytes."""
    return np.concatenate([e2m1_pack(codes), scales], axis=-1).astype(np.uint8)


def pack_swa(codes, scales):
    """SWA entry: d E4M3 bytes + d/32 UE8M0 bytes."""
    return np.concatenate([codes, scales], axis=-1).astype(np.uint8)
