"""Attention of spec 3.5-3.13: query path, RoPE, SWA KV, compressor, index keys and main KV,
indexer, candidate blocks, index lists, sparse attention with sink, output projection.

Per-sequence caches are held as the packed records of spec 6.1 (codes + scales); the values the
attention reads are the dequantized records, so they are by construction the QDQ values."""

import math

import numpy as np

from formats import (F32, F64, bf16_round, q8_quant, q8_dequant, q4mx_quant, q4mx_dequant, q4mx_qdq,
                     q4nv_quant, q4nv_dequant, pack_main_kv, pack_index_k, pack_swa)
from exact import (c32, exp32, matmul32, sum32, rmsnorm, softmax_exact, linear_quant,
                   linear_bf16, linear_f32)

NEG_INF = F32(-np.inf)
POS_INF = F32(np.inf)


# ---- 3.6 RoPE -------------------------------------------------------------------------------

def rope_inv_freq(d, theta, yarn, cfg):
    """FP32 inverse frequencies of the d/2 pairs (3.6, exact mode)."""
    j = np.arange(d // 2)
    e = (2 * j).astype(F32) / F32(d)
    pw = np.power(F64(theta), e.astype(F64)).astype(F32)
    inv = F32(1.0) / pw
    L0 = cfg["original_seq_len"]
    if yarn and L0 > 0:
        def corr(rot):
            return d * math.log(L0 / (rot * 2 * math.pi)) / (2 * math.log(theta))
        low = max(math.floor(corr(cfg["beta_fast"])), 0)
        high = min(math.ceil(corr(cfg["beta_slow"])), d - 1)
        ramp = np.clip((j.astype(F32) - F32(low)) / F32(max(high - low, 0.001)), F32(0), F32(1))
        smooth = F32(1) - ramp
        inv = ((inv / F32(cfg["rope_factor"])) * (F32(1) - smooth)) + (inv * smooth)
    return inv.astype(F32)


def rope_cos_sin(inv, positions):
    """angle = fp32(fp32(p) * inv); cos / sin in double, rounded once. [n, d/2] each."""
    ang = np.asarray(positions).astype(F32)[:, None] * inv[None, :]
    a64 = ang.astype(F64)
    return np.cos(a64).astype(F32), np.sin(a64).astype(F32)


def rope(x, cos, sin, inverse=False):
    """Rotate adjacent pairs of the last dim of x (BF16 values) -> BF16. cos/sin broadcast
    against x[..., 0::2]."""
    a, b = x[..., 0::2], x[..., 1::2]
    if inverse:
        re = (a * cos) + (b * sin)
        im = (b * cos) - (a * sin)
    else:
        re = (a * cos) - (b * sin)
        im = (a * sin) + (b * cos)
    out = np.empty_like(x)
    out[..., 0::2] = re
    out[..., 1::2] = im
    return bf16_round(out)


def rope_tail(x, rd, cos, sin, inverse=False):
    """Apply RoPE to the last rd dims of x, leaving the others untouched."""
    y = x.copy()
    y[..., -rd:] = rope(x[..., -rd:], cos, sin, inverse)
    return y


# ---- per-sequence caches (packed records) ---------------------------------------------------

class SwaRing:
    """window slots of (head_dim E4M3 codes, head_dim/32 UE8M0 scales); never-written slots stay 0."""

    def __init__(self, window, hd):
        self.codes = np.zeros((window, hd), dtype=np.uint8)
        self.scales = np.zeros((window, hd // 32), dtype=np.uint8)
        self.values = np.zeros((window, hd), dtype=F32)   # dequantized records

    def write(self, slot, codes, scales):
        self.codes[slot], self.scales[slot] = codes, scales
        self.values[slot] = q8_dequant(codes[None], scales[None])[0]

    def records(self):
        return pack_swa(self.codes, self.scales)


class EntryCache:
    """Compressed entries of one KV source: main KV (Q4nv) or index K (Q4mx)."""

    def __init__(self, kind, d):
        self.kind, self.d = kind, d
        self.codes = np.zeros((0, d), dtype=np.uint8)
        self.scales = np.zeros((0, d // (16 if kind == "main" else 32)), dtype=np.uint8)
        self.values = np.zeros((0, d), dtype=F32)

    def __len__(self):
        return self.codes.shape[0]

    def put(self, j0, codes, scales):
        """Write entries j0 .. j0+n-1 (j0 == current length: entries are produced in order)."""
        assert j0 == len(self), (j0, len(self))
        deq = q4nv_dequant if self.kind == "main" else q4mx_dequant
        self.codes = np.concatenate([self.codes, codes])
        self.scales = np.concatenate([self.scales, scales])
        self.values = np.concatenate([self.values, deq(codes, scales)])

    def records(self):
        pack = pack_main_kv if self.kind == "main" else pack_index_k
        return pack(self.codes, self.scales)


class CompressorState:
    """Ratio-r partial group: r rows of FP32 kv and score (initially 0 and -inf)."""

    def __init__(self, r, hd):
        self.kv = np.zeros((r, hd), dtype=F32)
        self.score = np.full((r, hd), NEG_INF, dtype=F32)


# ---- 3.5 query path -------------------------------------------------------------------------

def query_path(W, x, cfg, cos, sin):
    cq = rmsnorm(linear_quant(x, W["wq_a"]), W["q_norm"], cfg["norm_eps"])
    T = x.shape[0]
    q = linear_quant(cq, W["wq_b"]).reshape(T, cfg["n_heads"], cfg["head_dim"])
    q = rope_tail(q, cfg["rope_head_dim"], cos[:, None, :], sin[:, None, :])
    return cq, q


# ---- 3.7 SWA KV -----------------------------------------------------------------------------

def swa_kv(W, x, cfg, cos, sin):
    """Q8 records (codes, scales) and their dequantized values for the T rows."""
    k = rmsnorm(linear_quant(x, W["wkv"]), W["kv_norm"], cfg["norm_eps"])
    k = rope_tail(k, cfg["rope_head_dim"], cos, sin)
    codes, scales = q8_quant(k)
    return codes, scales, q8_dequant(codes, scales)


# ---- 3.8 compressor, index keys and main KV -------------------------------------------------

def compressor(W, x, r, start, state, cfg, decode):
    """New compressed latents c_j (BF16, pre-RoPE) completed in this forward, as (j0, [n, hd]).

    Ratio 1: one entry per token. Ratio r > 1 (FP32): per-channel softmax over the r tokens of a
    group; a group's entry is produced when its last token is processed; a group straddling the
    forward boundary takes its earlier rows from the state. State rows written: a decode step
    (T = 1, start > 0) writes row start mod r; a multi-token forward writes the rows of the tokens of
    its trailing incomplete group only (the official prefill rule, generalised)."""
    T = x.shape[0]
    if r == 1:
        return start, rmsnorm(linear_bf16(x, W["c_wkv"]), W["c_norm"], cfg["norm_eps"])
    kv = linear_f32(x, W["c_wkv"])
    sc = linear_f32(x, W["c_wgate"])
    end = start + T
    j0, j1 = start // r, end // r                # groups whose last token lies in [start, end)
    latents = []
    for j in range(j0, j1):
        rows_kv, rows_sc = [], []
        for p in range(j * r, j * r + r):
            if p >= start:
                rows_kv.append(kv[p - start])
                rows_sc.append(sc[p - start])
            else:
                rows_kv.append(state.kv[p % r])
                rows_sc.append(state.score[p % r])
        gkv, gsc = np.stack(rows_kv), np.stack(rows_sc)     # [r, hd]
        wts = softmax_exact(gsc, axis=0)
        latents.append(bf16_round(sum32(gkv * wts, axis=0)))
    if decode:
        state.kv[start % r], state.score[start % r] = kv[0], sc[0]
    else:
        for p in range(max(start, j1 * r), end):
            state.kv[p % r], state.score[p % r] = kv[p - start], sc[p - start]
    if not latents:
        return j0, None
    c = rmsnorm(np.stack(latents), W["c_norm"], cfg["norm_eps"])
    return j0, c


def emit_entries(W, c, j0, r, cfg, inv, main_cache, ik_cache):
    """3.8 steps 1-2 for new latents c [n, hd] (entries j0 ..): index key (Q4mx) from the pre-RoPE
    latent, then main KV (RoPE at position j*r, Q4nv)."""
    n = c.shape[0]
    pos = (np.arange(j0, j0 + n) * r)
    cos, sin = rope_cos_sin(inv, pos)
    rd = cfg["rope_head_dim"]
    ik = rmsnorm(linear_bf16(c, W["ix_wk"]), W["ix_k_norm"], cfg["norm_eps"])
    ik = rope_tail(ik, rd, cos, sin)
    ik_cache.put(j0, *q4mx_quant(ik))
    kv = rope_tail(c, rd, cos, sin)
    main_cache.put(j0, *q4nv_quant(kv))


# ---- 3.9 indexer, 3.10 candidate blocks -----------------------------------------------------

def stable_topk_desc(scores, k):
    """Indices of the k largest along the last axis; equal values -> lower index first."""
    order = np.argsort(-scores.astype(F64), axis=-1, kind="stable")
    return order[..., :k]


def indexer_scores(W, x, cq, positions, ik_values, r, cfg, cos, sin):
    """BF16 index scores [T, E] with the three BF16 roundings; -inf for j >= n_p."""
    T = x.shape[0]
    nh, ihd = cfg["index_n_heads"], cfg["index_head_dim"]
    iq = linear_quant(cq, W["ix_wq_b"]).reshape(T, nh, ihd)
    iq = rope_tail(iq, cfg["rope_head_dim"], cos[:, None, :], sin[:, None, :])
    iq = q4mx_qdq(iq)
    wt = bf16_round(linear_bf16(x, W["ix_weights_proj"]) * c32(ihd ** -0.5 * nh ** -0.5))   # [T, nh]
    s = bf16_round(matmul32(iq, ik_values.T))                          # [T, nh, E]
    t = bf16_round(np.maximum(s, F32(0)) * wt[:, :, None])
    score = bf16_round(sum32(t, axis=1))                                # [T, E]
    E = ik_values.shape[0]
    n_p = (np.asarray(positions) + 1) // r
    score = np.where(np.arange(E)[None, :] >= n_p[:, None], NEG_INF, score).astype(F32)
    return score, n_p


def candidate_blocks(score, n_p, topk_blocks, bs):
    """3.10: boolean mask [T, E] of entries in the chosen candidate blocks."""
    T, E = score.shape
    nb = -(-E // bs)
    pad = np.full((T, nb * bs), NEG_INF, dtype=F32)
    pad[:, :E] = score
    bscore = pad.reshape(T, nb, bs).max(axis=-1)
    last = (n_p - 1) // bs                       # floor: -1 when nothing is visible (no pin)
    for t in range(T):
        if last[t] >= 0:
            bscore[t, last[t]] = POS_INF
    chosen = stable_topk_desc(bscore, min(topk_blocks, nb))
    keep = np.zeros((T, nb), dtype=bool)
    rows = np.arange(T)[:, None]
    keep[rows, chosen] = bscore[rows, chosen] > NEG_INF
    return np.repeat(keep, bs, axis=1)[:, :E]


def select_topk(score, n_p, k):
    """Top-k entries per query (ties to the lower index), sorted ascending, -1 for j >= n_p."""
    sel = np.sort(stable_topk_desc(score, k), axis=-1)
    return np.where(sel >= n_p[:, None], -1, sel).astype(np.int64)


# ---- 3.11 index lists -----------------------------------------------------------------------

def swa_list_prefill(T, window):
    W = min(T, window)
    i = np.arange(T)[:, None]
    idx = np.maximum(0, i - window + 1) + np.arange(W)[None, :]
    return np.where(idx > i, -1, idx)


def swa_list_decode(P, window):
    o = P % window + 1
    slots = np.concatenate([np.arange(o, window), np.arange(o)])
    return np.where(slots > P, -1, slots)[None, :]


def swa_list_extend(P, T, window):
    """docs/conformance.md extend layout: query p lists positions base .. base+W-1 with
    W = min(P+T, window), base = max(0, p-window+1), -1 where > p. Returned as positions."""
    W = min(P + T, window)
    p = (P + np.arange(T))[:, None]
    pos = np.maximum(0, p - window + 1) + np.arange(W)[None, :]
    return np.where(pos > p, -1, pos)


# ---- 3.12 sparse attention with sink --------------------------------------------------------

def sparse_attention(q, kv, idx, sink, scale):
    """q [T, H, d] BF16; kv [N, d] BF16 rows; idx [T, L] (-1 = empty); sink [H] FP32.
    Online softmax over 64-wide blocks of list positions, BF16 probabilities in the PV product."""
    T, H, d = q.shape
    m = np.full((T, H), F32(-1e30), dtype=F32)
    den = np.zeros((T, H), dtype=F32)
    acc = np.zeros((T, H, d), dtype=F32)
    q64 = q.astype(F64)
    L = idx.shape[1]
    for b0 in range(0, L, 64):
        ids = idx[:, b0:b0 + 64]
        valid = ids != -1
        G = kv[np.where(valid, ids, 0)] * valid[:, :, None]                  # [T, B, d]
        G64 = G.astype(F64)
        dot = np.matmul(q64, G64.transpose(0, 2, 1)).astype(F32)            # [T, H, B]
        s = np.where(valid[:, None, :], dot * scale, NEG_INF).astype(F32)
        m_new = np.maximum(m, s.max(axis=-1))
        f = exp32(m - m_new)
        p = exp32(s - m_new[:, :, None])
        den = (den * f) + sum32(p, axis=-1)
        pv = np.matmul(bf16_round(p).astype(F64), G64).astype(F32)         # [T, H, d]
        acc = (acc * f[:, :, None]) + pv
        m = m_new
    with np.errstate(over="ignore"):
        den = den + exp32(sink[None, :] - m)
    with np.errstate(invalid="ignore", divide="ignore"):
        return bf16_round(acc / den[:, :, None])


# ---- 3.13 output projection -----------------------------------------------------------------

def output_projection(W, o, cfg, cos, sin):
    T, H, d = o.shape
    o = rope_tail(o, cfg["rope_head_dim"], cos[:, None, :], sin[:, None, :], inverse=True)
    G, R = cfg["o_groups"], cfg["o_lora_rank"]
    og = o.reshape(T, G, H // G * d)
    wo_a = W["wo_a"].reshape(G, R, H // G * d)
    z = np.stack([bf16_round(matmul32(og[:, g], wo_a[g].T)) for g in range(G)], axis=1)
    return linear_quant(z.reshape(T, G * R), W["wo_b"])
