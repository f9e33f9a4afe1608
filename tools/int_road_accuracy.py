#!/usr/bin/env python3
"""What the integer road would cost fast mode's numerics (issue 11, item 3).

An FP4 linear (E2M1 weights with a UE8M0 scale per 32, Q8 activations: E4M3 per 32 with a
power-of-two scale, v41-architecture.md 7.4) is computed three ways against its value in
float64 (exact products; its rounding of the sums is far below every effect measured here):
  fp32   the Q8 activations as they are, summed in FP32 (NumPy's order; fast mode sums in FP32 too),
  int16  each block rounded to int16 with u = 2^(floor(log2 max) - 14) (ds41's FP4 kernels:
         exact within 2^-11 of the block's largest element),
  int8   each block re-quantized to int8 with scale max / 127 (ggml's Q8_0, the road that runs
         at 2-3x the FMA rate on VNNI),
and the share of outputs whose BF16 rounding differs from the exact one's is printed. Random
data (seeded): weights uniform over the E2M1 values with random signs and block scales,
activations Gaussian and Student-t (3 degrees of freedom, heavy tails).

    /usr/bin/python3 tools/int_road_accuracy.py [--seed S]
"""
import argparse

import numpy as np


def e4m3(v):
    """Round to E4M3 (RNE; |v| <= 448 after the clip, subnormals on the 2^-9 grid)."""
    a = np.abs(v)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 2.0 ** -9))), -6)
    q = 2.0 ** (e - 3)
    return np.clip(np.round(v / q) * q, -448, 448)


def q8(x):
    """Q8 per 32 along the last axis: a power-of-two scale that maps the block's max to <= 448."""
    xb = x.reshape(-1, 32)
    amax = np.maximum(np.abs(xb).max(1, keepdims=True), 1e-4)
    s = 2.0 ** np.ceil(np.log2(amax / 448))
    return (e4m3(xb / s) * s).reshape(x.shape)


def int_round(xq, bits):
    xb = xq.reshape(-1, 32)
    m = np.maximum(np.abs(xb).max(1, keepdims=True), 1e-30)
    u = 2.0 ** (np.floor(np.log2(m)) - 14) if bits == 16 else m / 127
    return (np.round(xb / u) * u).reshape(xq.shape)


def bf16(v):
    b = v.astype(np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-K", type=int, default=5120)
    ap.add_argument("-N", type=int, default=2048)
    ap.add_argument("-T", type=int, default=16)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    K, N, T = a.K, a.N, a.T
    vals = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    W = rng.choice(vals, (N, K)) * rng.choice([-1, 1], (N, K))
    W = W * (2.0 ** rng.integers(-8, -4, (N, K // 32))).repeat(32, 1)
    print(f"K = {K}, {N} rows, {T} tokens: share of BF16 outputs unlike the exact one's; relative error median / p99")
    for name, x in (("gaussian", rng.standard_normal((T, K))), ("student-t 3", rng.standard_t(3, (T, K)))):
        xq = np.stack([q8(r) for r in x])
        ex = xq @ W.T
        rows = [("fp32", (xq.astype(np.float32) @ W.T.astype(np.float32)).astype(np.float64))]
        for bits in (16, 8):
            rows.append((f"int{bits}", np.stack([int_round(r, bits) for r in xq]) @ W.T))
        for label, y in rows:
            rel = np.abs(y - ex) / np.maximum(np.abs(ex), 1e-30)
            flip = np.mean(bf16(y) != bf16(ex))
            print(f"{name:12s} {label:6s} {100 * flip:6.2f} %   {np.median(rel):.1e} / {np.quantile(rel, 0.99):.1e}")


if __name__ == "__main__":
    main()
