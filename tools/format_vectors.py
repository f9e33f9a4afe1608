#!/usr/bin/env -S /usr/bin/python3
"""Independent expected values for ds41's number formats (spec section 7).

Written from the spec alone, on purpose in a different style from src/formats.c:
every conversion here is "decode table + pick the nearest representable value
in float64 (exact for all FP32 inputs), ties to the even code", whereas the C
side does integer rounding on the FP32 bits. Agreement of the two is the test.

Usage: format_vectors.py OUT_DIR      (tests/data/formats/ holds the committed copy)

Every file is   magic b"DS41FV01" | u32 record_count | u32 record_bytes | records,
all little-endian. Record layouts (pad = zero bytes):

  e4m3_decode.bin   u32 fp32-bits                          (256 records, code order)
  e2m1_decode.bin   u32 fp32-bits                          (16 records)
  ue8m0_decode.bin  u32 fp32-bits                          (256 records)
  e4m3_encode.bin   u32 in-bits, u8 code, pad 3
  e2m1_encode.bin   u32 in-bits, u8 code, pad 3
  bf16_ties.bin     u16 p, u16 out(p<<16|0x7FFF), u16 out(p<<16|0x8000), u16 out(p<<16|0x8001)
                    for every BF16 pattern p whose magnitude is finite
  bf16_misc.bin     u32 in-bits, u16 out, pad 2
  pow2ceil.bin      u32 a-bits, u32 inv-bits, u32 out-bits
  q8_groups.bin     32 x u16 BF16 in, 32 x u8 E4M3 codes, u8 scale byte, pad 3
  q4mx_groups.bin   32 x u16 BF16 in, 16 x u8 packed E2M1, u8 UE8M0 scale, pad 3
  q4nv_groups.bin   16 x u16 BF16 in, 8 x u8 packed E2M1, u8 E4M3 scale, pad 3
  q4nv_divmul.bin   u32 FP32 amax, u8 e4m3(a / 6), u8 e4m3(fp32(a * fp32(1/6))), pad 2
                    (amax values where the true division and the multiply differ; FP32,
                    because for BF16 amax values the two never differ)

NaN conventions that are choices rather than spec: E4M3 NaN decodes to the quiet
NaN 0x7FC00000 with the code's sign; BF16 of a NaN keeps the sign and the top 9
payload bits and sets the quiet bit ((bits >> 16) | 0x0040).

Random values come from a splitmix64 generator written out below (NumPy's own
generators do not promise stable streams across versions), so the files are
byte-reproducible.
"""
import os
import struct
import sys

import numpy as np

MAGIC = b"DS41FV01"
F32 = np.float32
INV448 = np.uint32(0x3B124925).view(F32)
INV6 = np.uint32(0x3E2AAAAB).view(F32)


# ----------------------------------------------------------------- helpers

def f32_from_bits(b):
    return np.asarray(b, dtype=np.uint32).view(F32)


def bits_from_f32(x):
    return np.asarray(x, dtype=F32).view(np.uint32)


def bf16_to_f32(p):
    return (np.asarray(p, dtype=np.uint32) << np.uint32(16)).view(F32)


class SplitMix64:
    """Deterministic 64-bit generator (splitmix64), vectorised over a counter."""

    def __init__(self, seed):
        self.state = np.uint64(seed)

    def u64(self, n):
        with np.errstate(over="ignore"):
            idx = np.arange(1, n + 1, dtype=np.uint64)
            z = self.state + idx * np.uint64(0x9E3779B97F4A7C15)
            self.state = self.state + np.uint64(n) * np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            return z ^ (z >> np.uint64(31))

    def ints(self, lo, hi, n):
        """n integers uniform in [lo, hi) (modulo bias is irrelevant here)."""
        return (lo + (self.u64(n) % np.uint64(hi - lo)).astype(np.int64)).astype(np.int64)


# ----------------------------------------------------------------- decode tables

def e4m3_table():
    """float64 value of each of the 256 codes (NaN for S.1111.111)."""
    c = np.arange(256)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 15
    m = (c & 7).astype(np.float64)
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * np.exp2(e - 7.0))
    val = np.copysign(mag, sign)
    val[(e == 15) & ((c & 7) == 7)] = np.nan
    return val


E2M1_MAGS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_table():
    c = np.arange(16)
    return np.copysign(E2M1_MAGS[c & 7], np.where(c & 8, -1.0, 1.0))


def ue8m0_table():
    e = np.arange(256, dtype=np.float64)
    v = np.exp2(e - 127.0)
    v[255] = np.nan
    return v


def f32_bits_of_values(v, nan_sign=None):
    """float64 values (exactly representable in FP32) -> FP32 bits; NaN -> quiet NaN."""
    out = bits_from_f32(np.asarray(v, dtype=np.float64).astype(F32)).copy()
    nan = np.isnan(v)
    sign = np.zeros(len(v), dtype=np.uint32) if nan_sign is None else nan_sign
    out[nan] = np.uint32(0x7FC00000) | sign[nan]
    return out


# ----------------------------------------------------------------- encoders

def nearest_even(mag, grid):
    """Index of the nearest entry of ascending grid (codes = indices), ties to even index.
    mag is float64 and lies within [grid[0], grid[-1]]."""
    hi = np.searchsorted(grid, mag, side="left")
    hi = np.clip(hi, 0, len(grid) - 1)
    lo = np.clip(hi - 1, 0, len(grid) - 1)
    exact = grid[hi] == mag
    dlo = mag - grid[lo]
    dhi = grid[hi] - mag
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.where(exact, hi, pick)


E4M3_POS = e4m3_table()[:127]           # codes 0..126: 0 .. 448 ascending


def e4m3_encode(x32):
    """FP32 array -> E4M3 codes: saturate at 448, nearest value, ties to even code."""
    x32 = np.asarray(x32, dtype=F32)
    b = bits_from_f32(x32)
    sign = ((b >> np.uint32(24)) & np.uint32(0x80)).astype(np.uint8)
    x = x32.astype(np.float64)
    nan = np.isnan(x)
    mag = np.minimum(np.abs(np.where(nan, 0.0, x)), 448.0)
    code = nearest_even(mag, E4M3_POS).astype(np.uint8)
    code = np.where(nan, np.uint8(0x7F), code)
    return (code | sign).astype(np.uint8)


def e2m1_encode(x32):
    """FP32 array -> E2M1 codes: clamp to 6, nearest magnitude, ties to even code,
    sign bit from the input's sign bit; NaN -> magnitude code 0 (no comparison holds)."""
    x32 = np.asarray(x32, dtype=F32)
    b = bits_from_f32(x32)
    sign = ((b >> np.uint32(28)) & np.uint32(8)).astype(np.uint8)
    x = x32.astype(np.float64)
    nan = np.isnan(x)
    mag = np.minimum(np.abs(np.where(nan, 0.0, x)), 6.0)
    code = nearest_even(mag, E2M1_MAGS).astype(np.uint8)
    return (code | sign).astype(np.uint8)


def bf16_encode(bits):
    """FP32 bit patterns -> BF16 patterns, round to nearest, ties to even."""
    bits = np.asarray(bits, dtype=np.uint32)
    sign = bits & np.uint32(0x80000000)
    mag = bits & np.uint32(0x7FFFFFFF)
    nan = mag > np.uint32(0x7F800000)
    inf = mag == np.uint32(0x7F800000)
    lo = mag & np.uint32(0xFFFF0000)
    hi = np.where(inf, lo, lo + np.uint32(0x10000))
    v = f32_from_bits(np.where(nan | inf, 0, mag)).astype(np.float64)
    vlo = f32_from_bits(np.where(inf, 0, lo)).astype(np.float64)
    # The successor of the largest finite BF16 is "2^128" for rounding purposes (IEEE overflow).
    vhi = np.where(hi == np.uint32(0x7F800000), 2.0 ** 128,
                   f32_from_bits(np.where(hi >= np.uint32(0x7F800000), 0, hi)).astype(np.float64))
    dlo, dhi = v - vlo, vhi - v
    lo16, hi16 = lo >> np.uint32(16), hi >> np.uint32(16)
    out = np.where(dlo < dhi, lo16, np.where(dhi < dlo, hi16, np.where(lo16 % 2 == 0, lo16, hi16)))
    out = np.where(inf, np.uint32(0x7F80), out)
    out = out | (sign >> np.uint32(16))
    out = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x0040), out)
    return out.astype(np.uint16)


def pow2ceil(a32, inv32):
    """2^ceil(log2(fp32(a * inv))) for normal positive products (frexp, no bit tricks)."""
    t = (np.asarray(a32, dtype=F32) * np.asarray(inv32, dtype=F32)).astype(F32)
    f, e = np.frexp(t.astype(np.float64))
    k = np.where(f == 0.5, e - 1, e)
    return np.ldexp(1.0, k).astype(F32)


# ----------------------------------------------------------------- quantizers

def clamp6(v):
    return np.where(v > 6, F32(6), np.where(v < -6, F32(-6), v)).astype(F32)


def q8(groups_bf16):
    x = bf16_to_f32(groups_bf16)
    a = np.maximum(np.abs(x).max(axis=1), F32(1e-4)).astype(F32)
    s = pow2ceil(a, INV448)
    codes = e4m3_encode((x / s[:, None]).astype(F32))
    scale = (np.log2(s.astype(np.float64)) + 127).astype(np.uint8)
    return codes, scale


def q4mx(groups_bf16):
    x = bf16_to_f32(groups_bf16)
    a = np.maximum(np.abs(x).max(axis=1), F32(6 * 2.0 ** -126)).astype(F32)
    s = pow2ceil(a, INV6)
    codes = e2m1_encode(clamp6((x / s[:, None]).astype(F32)))
    scale = (np.log2(s.astype(np.float64)) + 127).astype(np.uint8)
    return codes, scale


def q4nv(groups_bf16):
    x = bf16_to_f32(groups_bf16)
    a = np.maximum(np.abs(x).max(axis=1), F32(6 * 2.0 ** -9)).astype(F32)
    sc = e4m3_encode((a / F32(6)).astype(F32))
    s = e4m3_table()[sc].astype(F32)
    codes = e2m1_encode(clamp6((x / s[:, None]).astype(F32)))
    return codes, sc


def pack_nibbles(codes):
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


# ----------------------------------------------------------------- inputs

def with_neighbours(v32):
    """Each FP32 value and the FP32 values one ulp below and above it (both signs)."""
    v32 = np.asarray(v32, dtype=F32)
    v32 = np.concatenate([v32, -v32])
    up = np.nextafter(v32, F32(np.inf), dtype=F32)
    dn = np.nextafter(v32, F32(-np.inf), dtype=F32)
    return np.stack([dn, v32, up], axis=1).reshape(-1)


SPECIAL_BITS = np.array([
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x80800000,
    0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
    0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0x7F80FFFF, 0x3F800000, 0xBF800000,
], dtype=np.uint32)


def random_f32(rng, n, emin, emax):
    """FP32 values with random sign, exponent in [emin, emax] and random mantissa."""
    sign = (rng.ints(0, 2, n).astype(np.uint32) << np.uint32(31))
    e = (rng.ints(emin, emax + 1, n) + 127).astype(np.uint32)
    m = (rng.u64(n) & np.uint64(0x7FFFFF)).astype(np.uint32)
    return f32_from_bits(sign | (e << np.uint32(23)) | m)


def e4m3_inputs(rng):
    grid = E4M3_POS.astype(F32)
    mids = ((E4M3_POS[:-1] + E4M3_POS[1:]) / 2).astype(F32)   # exact in FP32
    extra = np.array([448.0, 456.0, 464.0, 472.0, 480.0, 512.0, 1e4, 1e30, 2.0 ** -10,
                      2.0 ** -11, 3 * 2.0 ** -11, 2.0 ** -12, 2.0 ** -20, 2.0 ** -126], dtype=F32)
    parts = [with_neighbours(mids), with_neighbours(grid), with_neighbours(extra),
             f32_from_bits(SPECIAL_BITS), random_f32(rng, 3000, -14, 9)]
    return np.concatenate(parts).astype(F32)


def e2m1_inputs(rng):
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=F32)
    extra = np.array([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0, 448.0, 1e30, 1e-30,
                      2.0 ** -126], dtype=F32)
    parts = [with_neighbours(mids), with_neighbours(extra), f32_from_bits(SPECIAL_BITS),
             random_f32(rng, 1500, -4, 3)]
    return np.concatenate(parts).astype(F32)


def bf16_misc_inputs(rng):
    parts = [SPECIAL_BITS,
             np.array([0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001, 0xFF7F8000, 0x00008000, 0x00018000,
                       0x80008000, 0x00007FFF, 0x0000FFFF, 0x7FC00001, 0x7F810000, 0xFF8A5A5A],
                      dtype=np.uint32),
             (rng.u64(4096) & np.uint64(0xFFFFFFFF)).astype(np.uint32)]
    return np.concatenate(parts).astype(np.uint32)


def pow2ceil_inputs(rng):
    """(a, inv) pairs: products that are exact powers of two, one ulp above/below,
    and random ones, for both constants and for inv = 1."""
    one = F32(1.0)
    rows = []
    for k in range(-100, 100, 7):
        p = F32(2.0 ** k)
        for v in (p, np.nextafter(p, F32(np.inf), dtype=F32), np.nextafter(p, F32(0), dtype=F32)):
            rows.append((v, one))
    for inv, top in ((INV448, 448.0), (INV6, 6.0)):
        for k in range(-110, 110, 5):
            base = F32(top * 2.0 ** k)
            # walk a few ulps around top * 2^k: some give t == 2^k exactly, some just above
            v = base
            for _ in range(4):
                v = np.nextafter(v, F32(0), dtype=F32)
            for _ in range(9):
                rows.append((v, inv))
                v = np.nextafter(v, F32(np.inf), dtype=F32)
        for a in random_f32(rng, 300, -100, 100):
            rows.append((abs(a), inv))
    a = np.array([r[0] for r in rows], dtype=F32)
    inv = np.array([r[1] for r in rows], dtype=F32)
    t = (a * inv).astype(F32)
    ok = np.abs(t.astype(np.float64)) >= 2.0 ** -126      # spec: t is always normal
    return a[ok], inv[ok]


def bf16_bits_of(x64):
    """float64 values that are exactly BF16 -> BF16 patterns."""
    return (bits_from_f32(np.asarray(x64, dtype=np.float64).astype(F32)) >> np.uint32(16)).astype(np.uint16)


def random_groups(rng, n_groups, size, kind_tie_builder):
    """BF16 groups of several kinds (see comments); returns uint16 [n, size]."""
    out = np.zeros((n_groups, size), dtype=np.uint16)
    kinds = rng.ints(0, 8, n_groups)
    for g in range(n_groups):
        k = kinds[g]
        sign = (rng.ints(0, 2, size).astype(np.uint16) << np.uint16(15))
        man = rng.ints(0, 128, size).astype(np.uint16)
        if k <= 2:      # ordinary: exponent centre anywhere in a wide range, spread of 6 binades
            c = int(rng.ints(-40, 40, 1)[0])
            e = (c + rng.ints(-6, 1, size) + 127).astype(np.uint16)
            out[g] = sign | (e << np.uint16(7)) | man
        elif k == 3:    # zeros of both signs, sometimes with one tiny value
            out[g] = sign
            if rng.ints(0, 2, 1)[0]:
                out[g, rng.ints(0, size, 1)[0]] = rng.ints(1, 0x0100, 1)[0]
        elif k == 4:    # tiny: BF16 subnormals and the lowest binades
            e = rng.ints(0, 4, size).astype(np.uint16)
            out[g] = sign | (e << np.uint16(7)) | man
        elif k == 5:    # huge: up to the largest finite BF16
            e = rng.ints(230, 255, size).astype(np.uint16)
            out[g] = sign | (e << np.uint16(7)) | man
        else:           # exact rounding ties after the division by the scale
            out[g] = kind_tie_builder(rng, size, sign)
    return out


def q8_ties(rng, size, sign):
    k = int(rng.ints(-30, 30, 1)[0])
    mids = (E4M3_POS[:-1] + E4M3_POS[1:]) / 2
    vals = np.concatenate([mids, E4M3_POS])[rng.ints(0, 2 * len(E4M3_POS) - 1, size)] * 2.0 ** k
    vals[rng.ints(0, size, 1)[0]] = 300.0 * 2.0 ** k     # amax 300 * 2^k -> s = 2^k
    return bf16_bits_of(vals) | sign


def q4mx_ties(rng, size, sign):
    k = int(rng.ints(-120, 120, 1)[0])
    pool = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 0.0])
    vals = pool[rng.ints(0, len(pool), size)] * 2.0 ** k
    vals[rng.ints(0, size, 1)[0]] = 5.5 * 2.0 ** k       # amax 5.5 * 2^k -> s = 2^k
    return bf16_bits_of(vals) | sign


def q4nv_ties(rng, size, sign):
    s0 = E4M3_POS[int(rng.ints(1, 127, 1)[0])]
    pool = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 0.0])
    vals = pool[rng.ints(0, len(pool), size)] * s0
    vals[rng.ints(0, size, 1)[0]] = 6.0 * s0             # a / 6 = s0 exactly
    return bf16_bits_of(vals) | sign


def q4nv_divmul_cases():
    """FP32 amax values where e4m3(a / 6) != e4m3(fp32(a * fp32(1/6))).

    For BF16 amax values the two always agree (searched exhaustively: a BF16 value
    near 6 x an E4M3 midpoint is that exact multiple, and both quotients then round
    to the midpoint itself), so the cases are FP32 values within 64 ulps of
    6 x midpoint; the C quantizer takes any float, and must divide."""
    mids = ((E4M3_POS[:-1] + E4M3_POS[1:]) / 2).astype(F32)
    base = bits_from_f32((mids.astype(np.float64) * 6).astype(F32)).astype(np.int64)
    a = f32_from_bits((base[:, None] + np.arange(-64, 65)[None, :]).reshape(-1).astype(np.uint32))
    a = a[a >= F32(6 * 2.0 ** -9)]
    div = e4m3_encode((a / F32(6)).astype(F32))
    mul = e4m3_encode((a * INV6).astype(F32))
    d = div != mul
    return bits_from_f32(a[d]), div[d], mul[d]


def bf16_divmul_count():
    """Number of positive finite BF16 amax values where the division and the multiply differ."""
    p = np.arange(0x0001, 0x7F80, dtype=np.uint32)
    a = np.maximum(bf16_to_f32(p), F32(6 * 2.0 ** -9))
    return int(np.count_nonzero(e4m3_encode((a / F32(6)).astype(F32)) !=
                                e4m3_encode((a * INV6).astype(F32))))


# ----------------------------------------------------------------- writing

def write(out_dir, name, records):
    """records: 2-D uint8 array [count, record_bytes]."""
    records = np.ascontiguousarray(records, dtype=np.uint8)
    with open(os.path.join(out_dir, name), "wb") as f:
        f.write(MAGIC + struct.pack("<II", records.shape[0], records.shape[1]))
        f.write(records.tobytes())


def cols(*arrays):
    """Concatenate per-record fields (each [count] or [count, k], any little-endian dtype)."""
    parts = []
    for a in arrays:
        a = np.asarray(a)
        a = a.reshape(a.shape[0], -1)
        parts.append(np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"))).view(np.uint8))
    return np.concatenate(parts, axis=1)


def pad(n, k):
    return np.zeros((n, k), dtype=np.uint8)


def generate(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rng = SplitMix64(0xD541F0)

    e4 = e4m3_table()
    e4_nan_sign = np.where(np.arange(256) & 0x80, 0x80000000, 0).astype(np.uint32)
    write(out_dir, "e4m3_decode.bin", cols(f32_bits_of_values(e4, e4_nan_sign)))
    write(out_dir, "e2m1_decode.bin", cols(f32_bits_of_values(e2m1_table())))
    write(out_dir, "ue8m0_decode.bin", cols(f32_bits_of_values(ue8m0_table())))

    x = e4m3_inputs(rng)
    write(out_dir, "e4m3_encode.bin", cols(bits_from_f32(x), e4m3_encode(x), pad(len(x), 3)))
    x = e2m1_inputs(rng)
    write(out_dir, "e2m1_encode.bin", cols(bits_from_f32(x), e2m1_encode(x), pad(len(x), 3)))

    p = np.arange(0x10000, dtype=np.uint32)
    p = p[(p & 0x7FFF) < 0x7F80]
    base = p << np.uint32(16)
    write(out_dir, "bf16_ties.bin", cols(p.astype(np.uint16), bf16_encode(base | 0x7FFF),
                                         bf16_encode(base | 0x8000), bf16_encode(base | 0x8001)))
    b = bf16_misc_inputs(rng)
    write(out_dir, "bf16_misc.bin", cols(b, bf16_encode(b), pad(len(b), 2)))

    a, inv = pow2ceil_inputs(rng)
    write(out_dir, "pow2ceil.bin", cols(bits_from_f32(a), bits_from_f32(inv),
                                        bits_from_f32(pow2ceil(a, inv))))

    n = 1500
    g = random_groups(rng, n, 32, q8_ties)
    c, s = q8(g)
    write(out_dir, "q8_groups.bin", cols(g, c, s, pad(n, 3)))
    g = random_groups(rng, n, 32, q4mx_ties)
    c, s = q4mx(g)
    write(out_dir, "q4mx_groups.bin", cols(g, pack_nibbles(c), s, pad(n, 3)))
    g = random_groups(rng, n, 16, q4nv_ties)
    c, s = q4nv(g)
    write(out_dir, "q4nv_groups.bin", cols(g, pack_nibbles(c), s, pad(n, 3)))
    pa, pdiv, pmul = q4nv_divmul_cases()
    write(out_dir, "q4nv_divmul.bin", cols(pa, pdiv, pmul, pad(len(pa), 2)))

if __name__ == "__main__":
    np.seterr(invalid="ignore")    # NaN inputs are deliberate
    if len(sys.argv) != 2:
        sys.exit("usage: format_vectors.py OUT_DIR")
    generate(sys.argv[1])
