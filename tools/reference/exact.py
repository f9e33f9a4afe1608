"""The exact-mode arithmetic contract (exact-mode.md) as numpy primitives.

* Contractions, sums and means: float64 accumulation of exactly formed products, rounded once
  to FP32 (then to the output dtype by the caller or here).
* Transcendentals: evaluated in float64 from the FP32 input, rounded once to FP32.
* + - * / sqrt min max clamp: numpy float32 array arithmetic (IEEE, correctly rounded, no FMA).

np.sum / np.dot on float32 have no defined order; nothing here reduces in float32.
"""

import os

import numpy as np

from formats import F32, F64, bf16_round, e4m3_encode, e4m3_decode, pow2ceil, INV448

# bytes of decoded double weights kept between calls (DS41_REF_CACHE_MB, default 1.5 GiB); weights
# past the budget are decoded again on every use
_cache_left = int(os.environ.get("DS41_REF_CACHE_MB", "1536")) * (1 << 20)


# ---- constants: Python numbers rounded to FP32 before use -----------------------------------


def c32(v):
    return F32(v)


# ---- reductions -----------------------------------------------------------------------------

def sum32(x, axis=-1):
    """Sum of already-rounded FP32/BF16 terms: double accumulation, one rounding to FP32."""
    return np.sum(np.asarray(x, dtype=F64), axis=axis).astype(F32)


def mean32(x, axis=-1):
    """mean = double sum / n in double, rounded once to FP32."""
    x = np.asarray(x, dtype=F64)
    n = x.shape[axis]
    return (np.sum(x, axis=axis) / F64(n)).astype(F32)


def matmul32(a, b):
    """a [.., K] @ b [K, N] with products exact in double, summed in double, rounded to FP32.
    Operands are FP32 or BF16 values (products of two FP32 values are exact in double)."""
    return np.matmul(np.asarray(a, dtype=F64), np.asarray(b, dtype=F64)).astype(F32)


# ---- transcendentals (double, one rounding) -------------------------------------------------

def exp32(x):
    return np.exp(np.asarray(x, dtype=F32).astype(F64)).astype(F32)


def rsqrt32(x):
    return (1.0 / np.sqrt(np.asarray(x, dtype=F32).astype(F64))).astype(F32)


def sigmoid32(x):
    x64 = np.asarray(x, dtype=F32).astype(F64)
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x64))).astype(F32)


def silu32(x):
    x64 = np.asarray(x, dtype=F32).astype(F64)
    with np.errstate(over="ignore"):
        return (x64 / (1.0 + np.exp(-x64))).astype(F32)


def softplus32(x):
    """x > 20 ? x : log1p(exp(x)) (the test on the FP32 input)."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(over="ignore"):
        y = np.log1p(np.exp(x.astype(F64))).astype(F32)
    return np.where(x > F32(20.0), x, y).astype(F32)


def softmax_exact(x, axis):
    """softmax as one operation, entirely in double; each weight rounded once to FP32."""
    x64 = np.asarray(x, dtype=F32).astype(F64)
    m = np.max(x64, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(x64 - m)
        return (e / np.sum(e, axis=axis, keepdims=True)).astype(F32)


# ---- RMSNorm (3.0) --------------------------------------------------------------------------

def rmsnorm(x, w, eps):
    """x BF16 values [.., d]; w BF16 [d]. y = bf16(w * (x * rsqrt(mean(x*x) + eps)))."""
    x = np.asarray(x, dtype=F32)
    v = mean32(x * x) + c32(eps)
    r = rsqrt32(v)
    return bf16_round(np.asarray(w, dtype=F32) * (x * r[..., None]))


# ---- Q8 activation quantization (dequantized values) ---------------------------------------

def q8_act_dq(x):
    """Q8 of a BF16 activation [T, K], returned as the exact FP32 values q*s (per 32-group)."""
    T, K = x.shape
    xg = np.asarray(x, dtype=F32).reshape(T, K // 32, 32)
    a = np.maximum(np.max(np.abs(xg), axis=-1), F32(1e-4))
    s = pow2ceil(a, INV448)
    q = e4m3_encode(np.clip(xg / s[..., None], F32(-448.0), F32(448.0)))
    return (e4m3_decode(q) * s[..., None]).reshape(T, K)


# ---- linears (3.0) --------------------------------------------------------------------------

class PlainWeight:
    """A BF16 or FP32 weight [N, K] used without activation quantization. rows(a, b) gives the
    FP32 values of rows a..b-1 (read from the checkpoint on demand)."""

    def __init__(self, N, K, rows):
        self.N, self.K, self.rows = N, K, rows
        self._w64t = None

    def w64t(self):
        """[K, N] double, kept if within the cache budget, else None."""
        global _cache_left
        if self._w64t is None and 8 * self.N * self.K <= _cache_left:
            _cache_left -= 8 * self.N * self.K
            self._w64t = np.ascontiguousarray(self.rows(0, self.N).astype(F64).T)
        return self._w64t


def linear_f32(x, W):
    """FP32-result linear: double dot of the FP32/BF16 operands, rounded once to FP32."""
    x64 = np.asarray(x, dtype=F32).astype(F64)
    w = W.w64t()
    if w is not None:
        return np.matmul(x64, w).astype(F32)
    out = np.empty((x64.shape[0], W.N), dtype=F32)       # too big to keep: 8192 rows at a time
    for a in range(0, W.N, 8192):
        b = min(W.N, a + 8192)
        out[:, a:b] = np.matmul(x64, W.rows(a, b).astype(F64).T).astype(F32)
    return out


def linear_bf16(x, W):
    """BF16 linear: double -> FP32 -> BF16."""
    return bf16_round(linear_f32(x, W))


class BlockWeight:
    """A quantized weight [N, K] with a power-of-two scale per (row, 32-wide K block):
    FP8 E4M3 codes with 32x32 UE8M0 tiles, or FP4 E2M1 codes with per-row per-32 UE8M0 scales.
    Held as the dequantized double values per K block, [nb, 32, N] (each value code * scale is
    exact in double), built lazily."""

    def __init__(self, N, K, decode_block):
        assert K % 32 == 0, "quantized linear K=%d not a multiple of 32" % K
        self.N, self.K, self.nb = N, K, K // 32
        self._decode_block = decode_block   # b -> float64 [N, 32] of code*scale
        self._blocks = None

    def blocks(self):
        if self._blocks is not None:
            return self._blocks
        global _cache_left
        size = 8 * self.N * self.K
        if size > _cache_left:
            # too big to keep: decode each block again on every use (slow but bounded memory)
            return (np.ascontiguousarray(self._decode_block(b).T) for b in range(self.nb))
        _cache_left -= size
        self._blocks = [np.ascontiguousarray(self._decode_block(b).T) for b in range(self.nb)]
        return self._blocks



def linear_quant(x, W):
    """FP8 / FP4 linear (3.0, exact-mode.md): Q8 of the BF16 input per 32; per K block the dot
    product of the dequantized values in double (exact: E4M3 x E4M3 and E4M3 x E2M1 products of
    one block sum to at most ~41 significant bits), i.e. (sum qa*qw) * sa * sw; blocks added in
    double in increasing K order from 0; one rounding to FP32, then BF16."""
    xq = q8_act_dq(np.asarray(x, dtype=F32)).astype(F64)
    acc = np.zeros((xq.shape[0], W.N), dtype=F64)
    for b, wb in enumerate(W.blocks()):
        acc = acc + xq[:, 32 * b:32 * b + 32] @ wb
    return bf16_round(acc.astype(F32))
