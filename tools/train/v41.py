"""A differentiable twin of the V4.1 forward pass (spec sections 3.1-3.15, 5.1-5.2) in torch.

It follows tools/reference/model.py op by op, batched over [B, T] windows that start at
position 0, with three switches:

* `sim` (simulate the release numerics): BF16 rounding where the spec rounds to BF16, Q8 of the
  input of every FP8/FP4 linear, the Q8 SWA K records, the Q4nv main-KV and Q4mx index-K records
  and the Q4mx index query, all as straight-through fake quantization (forward: the quantized
  value, backward: identity). Off for the FP32 pre-training, on for quantization-aware
  fine-tuning and for evaluation against ds41.
* `wq` (weight fake quantization): FP8 32x32 tiles, FP4 E2M1 per 32, BF16, E4M3 Engram rows,
  as export.py writes them. On for quantization-aware fine-tuning.
* `sparse`: attention over the sliding window plus the indexer's top-k compressed entries (the
  inference rule). Off: every visible compressed entry (the dense warm-up of the indexer).

The indexer is trained as DeepSeek trains its lightning indexer: a KL term from the main
attention's distribution over the compressed entries (summed over heads, renormalised,
detached) to the softmax of the index scores, with the indexer's inputs detached so that the
term trains only the indexer.
"""

import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from checkpoint import parse_config, layer_plan  # noqa: E402
import attention as RA  # noqa: E402
from engram import EngramConstants  # noqa: E402


# ---- fake quantization (straight-through) ----------------------------------------------------

def ste(x, q):
    return x + (q - x).detach()


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def pow2ceil(t):
    """2^ceil(log2 t) for positive normal t (the UE8M0 scale rule of spec 7.4)."""
    m, e = torch.frexp(t)
    return torch.ldexp(torch.ones_like(t), torch.where(m == 0.5, e - 1, e))


def e4m3(v):
    """Round FP32 values (already scaled) to E4M3, saturating at 448; RNE."""
    a = v.abs().clamp(max=448.0)
    e = torch.floor(torch.log2(a.clamp(min=2.0 ** -10))).clamp(min=-6.0)
    step = torch.exp2(e - 3.0)
    return torch.sign(v) * torch.round(a / step) * step


_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1(v):
    a = v.abs().clamp(max=6.0)
    code = ((a > 0.25).long() + (a >= 0.75).long() + (a > 1.25).long() + (a >= 1.75).long()
            + (a > 2.5).long() + (a >= 3.5).long() + (a > 5.0).long())
    return torch.sign(v) * _E2M1[code]


def groups(x, g):
    return x.reshape(x.shape[:-1] + (x.shape[-1] // g, g))


def q8_dq(x):
    xg = groups(x, 32)
    a = xg.abs().amax(-1, keepdim=True).clamp(min=1e-4)
    s = pow2ceil(a / 448.0)
    return (e4m3((xg / s).clamp(-448.0, 448.0)) * s).reshape(x.shape)


def q4mx_dq(x):
    xg = groups(x, 32)
    a = xg.abs().amax(-1, keepdim=True).clamp(min=6.0 * 2.0 ** -126)
    s = pow2ceil(a / 6.0)
    return (e2m1((xg / s).clamp(-6.0, 6.0)) * s).reshape(x.shape)


def q4nv_dq(x):
    xg = groups(x, 16)
    a = xg.abs().amax(-1, keepdim=True).clamp(min=6.0 * 2.0 ** -9)
    s = e4m3((a / 6.0).clamp(max=448.0))
    return (e2m1((xg / s).clamp(-6.0, 6.0)) * s).reshape(x.shape)


def fp8_tile_dq(w):
    """Weight [N, K] -> E4M3 x UE8M0 per 32x32 tile (N, K multiples of 32 or padded)."""
    N, K = w.shape
    Np, Kp = -(-N // 32) * 32, -(-K // 32) * 32
    wp = F.pad(w, (0, Kp - K, 0, Np - N))
    t = wp.reshape(Np // 32, 32, Kp // 32, 32)
    a = t.abs().amax(dim=(1, 3), keepdim=True).clamp(min=2.0 ** -100)
    s = pow2ceil(a / 448.0)
    q = e4m3((t / s).clamp(-448.0, 448.0)) * s
    return q.reshape(Np, Kp)[:N, :K]


def fp4_row_dq(w):
    wg = groups(w, 32)
    a = wg.abs().amax(-1, keepdim=True).clamp(min=2.0 ** -100)
    s = pow2ceil(a / 6.0)
    return (e2m1((wg / s).clamp(-6.0, 6.0)) * s).reshape(w.shape)


def e4m3_row_dq(w):
    """Engram table rows: E4M3 codes with a UE8M0 scale per 32."""
    wg = groups(w, 32)
    a = wg.abs().amax(-1, keepdim=True).clamp(min=2.0 ** -100)
    s = pow2ceil(a / 448.0)
    return (e4m3((wg / s).clamp(-448.0, 448.0)) * s).reshape(w.shape)


# ---- modules ---------------------------------------------------------------------------------

class Ctx:
    """Forward switches."""

    def __init__(self, sim=False, wq=False, sparse=True, want_kl=False):
        self.sim, self.wq, self.sparse, self.want_kl = sim, wq, sparse, want_kl


class Linear(nn.Module):
    """kind: 'fp8' (E4M3 32x32 tiles, Q8 input), 'fp4' (E2M1 per 32, Q8 input), 'bf16', 'f32'."""

    def __init__(self, n_in, n_out, kind, gain=1.0):
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * (gain / math.sqrt(n_in)))

    def w(self, c):
        if not c.wq:
            return self.weight
        if self.kind == "fp8":
            return ste(self.weight, fp8_tile_dq(self.weight))
        if self.kind == "fp4":
            return ste(self.weight, fp4_row_dq(self.weight))
        if self.kind == "bf16":
            return ste(self.weight, bf16(self.weight))
        return self.weight

    def forward(self, x, c, out_bf16=True):
        if c.sim and self.kind in ("fp8", "fp4"):
            x = ste(x, q8_dq(x))
        y = F.linear(x, self.w(c))
        if c.sim and out_bf16 and self.kind != "f32":
            y = ste(y, bf16(y))
        return y


class Norm(nn.Module):
    def __init__(self, n, eps, mean=1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.full((n,), float(mean)))
        self.eps = eps

    def forward(self, x, c):
        w = ste(self.weight, bf16(self.weight)) if c.wq else self.weight
        y = w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps))
        return ste(y, bf16(y)) if c.sim else y


def rb(x, c):
    return ste(x, bf16(x)) if c.sim else x


def rope_tail(x, rd, cos, sin, c, inverse=False):
    """RoPE on the last rd dims (adjacent pairs) of x [..., d]; cos/sin broadcast against
    x[..., -rd:][..., 0::2]."""
    head, tail = x[..., :-rd], x[..., -rd:]
    a, b = tail[..., 0::2], tail[..., 1::2]
    if inverse:
        re, im = a * cos + b * sin, b * cos - a * sin
    else:
        re, im = a * cos - b * sin, a * sin + b * cos
    t = torch.stack([re, im], dim=-1).reshape(tail.shape)
    return torch.cat([head, rb(t, c)], dim=-1)


class MHC(nn.Module):
    """3.4: pre / post / Sinkhorn-normalised C from the stream."""

    def __init__(self, cfg):
        super().__init__()
        hc, d = cfg["hc_mult"], cfg["dim"]
        mix = (2 + hc) * hc
        self.hc, self.iters, self.eps, self.neps = hc, cfg["hc_sinkhorn_iters"], cfg["hc_eps"], cfg["norm_eps"]
        self.fn = nn.Parameter(torch.randn(mix, hc * d) * (0.5 / math.sqrt(hc * d)))
        base = torch.zeros(mix)
        base[hc:2 * hc] = 0.0
        base[2 * hc:] = (torch.eye(hc) * 4.0 - 2.0).reshape(-1)      # C starts near the identity
        self.base = nn.Parameter(base)
        self.scale = nn.Parameter(torch.tensor([0.5, 0.5, 0.5]))

    def forward(self, X):
        B, T, hc, d = X.shape
        x = X.reshape(B, T, hc * d)
        m = F.linear(x, self.fn) * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.neps)
        pre = torch.sigmoid(m[..., :hc] * self.scale[0] + self.base[:hc]) + self.eps
        post = 2.0 * torch.sigmoid(m[..., hc:2 * hc] * self.scale[1] + self.base[hc:2 * hc])
        C = (m[..., 2 * hc:] * self.scale[2] + self.base[2 * hc:]).reshape(B, T, hc, hc)
        # Sinkhorn on [.., hc, hc] as hc x hc separate planes: torch's reductions over a
        # 4-wide axis are very slow on the CPU, plain elementwise adds are not
        C = torch.softmax(C, dim=-1) + self.eps
        P = [[C[..., i, j] for j in range(hc)] for i in range(hc)]
        eps = self.eps

        def colnorm(P):
            s = [sum(P[i][j] for i in range(hc)) + eps for j in range(hc)]
            return [[P[i][j] / s[j] for j in range(hc)] for i in range(hc)]

        def rownorm(P):
            s = [sum(P[i]) + eps for i in range(hc)]
            return [[P[i][j] / s[i] for j in range(hc)] for i in range(hc)]
        P = colnorm(P)
        for _ in range(self.iters - 1):
            P = colnorm(rownorm(P))
        return pre, post, P


def apply_pre(X, pre, c):
    Xs = X.unbind(2)
    o = pre[..., 0:1] * Xs[0]
    for i in range(1, len(Xs)):
        o = o + pre[..., i:i + 1] * Xs[i]
    return rb(o, c)


def apply_post(y, R, post, P, c):
    """out[j] = post[j]*y + sum_i C[i][j]*R[i]; P[i][j] are the planes of C ([B, T] each)."""
    hc = len(P)
    Rs = R.unbind(2)
    outs = []
    for j in range(hc):
        o = post[..., j:j + 1] * y
        for i in range(hc):
            o = o + P[i][j][..., None] * Rs[i]
        outs.append(o)
    return rb(torch.stack(outs, dim=2), c)


class Expert(nn.Module):
    def __init__(self, d, inter, kind):
        super().__init__()
        self.w1 = Linear(d, inter, kind)
        self.w3 = Linear(d, inter, kind)
        self.w2 = Linear(inter, d, kind, gain=0.5)

    def forward(self, x, c, lim, weight=None):
        a = self.w1(x, c)
        b = self.w3(x, c)
        if lim > 0:
            b = b.clamp(-lim, lim)
            a = a.clamp(max=lim)
        u = F.silu(a) * b
        if weight is not None:
            u = weight * u
        return self.w2(rb(u, c), c)


class MoE(nn.Module):
    def __init__(self, cfg, n_experts, n_active):
        super().__init__()
        d, inter = cfg["dim"], cfg["moe_inter_dim"]
        self.cfg, self.E, self.k = cfg, n_experts, n_active
        self.gate = Linear(d, n_experts, "bf16")
        self.register_buffer("bias", torch.zeros(n_experts))
        self.experts = nn.ModuleList([Expert(d, inter, "fp4") for _ in range(n_experts)])
        self.shared = Expert(d, inter * cfg["n_shared_experts"], "fp8")
        self.load = None

    def forward(self, x, c):
        cfg = self.cfg
        shp = x.shape
        x2 = x.reshape(-1, shp[-1])
        logit = F.linear(x2, self.gate.w(c)) / cfg["gate_temp"]
        score = torch.sqrt(F.softplus(logit, threshold=20.0))
        sel = torch.topk((score + self.bias).detach(), self.k, dim=-1).indices
        w = torch.gather(score, 1, sel)
        if cfg["norm_topk_prob"] and self.k > 1:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = w * cfg["route_scale"]
        lim = cfg["swiglu_limit"]
        y = torch.zeros_like(x2)
        counts = torch.zeros(self.E)
        for e in range(self.E):
            rows, ranks = torch.nonzero(sel == e, as_tuple=True)
            counts[e] = rows.numel()
            if rows.numel() == 0:
                continue
            out = self.experts[e](x2[rows], c, lim, w[rows, ranks][:, None])
            y = y.index_add(0, rows, out)
        y = y + self.shared(x2, c, lim)
        self.load = counts
        return rb(y, c).reshape(shp)

    @torch.no_grad()
    def balance(self, rate):
        """Auxiliary-loss-free balancing (DeepSeek-V3 noaux_tc): nudge the selection bias of
        overloaded experts down and of underloaded ones up."""
        if self.load is not None and self.load.sum() > 0:
            self.bias += rate * torch.sign(self.load.mean() - self.load)


class Attention(nn.Module):
    def __init__(self, cfg, p):
        super().__init__()
        d, H, hd, ql = cfg["dim"], cfg["n_heads"], cfg["head_dim"], cfg["q_lora_rank"]
        G, R = cfg["o_groups"], cfg["o_lora_rank"]
        eps = cfg["norm_eps"]
        self.cfg, self.p = cfg, p
        self.wq_a = Linear(d, ql, "fp8")
        self.q_norm = Norm(ql, eps)
        self.wq_b = Linear(ql, H * hd, "fp8")
        self.wkv = Linear(d, hd, "fp8")
        self.kv_norm = Norm(hd, eps)
        self.wo_a = Linear(H * hd // G, G * R, "fp8")
        self.wo_b = Linear(G * R, d, "fp8", gain=0.5)
        self.sink = nn.Parameter(torch.zeros(H))
        if p.is_kv_source:
            self.c_wkv = Linear(d, hd, "bf16")              # BF16 weights (FP32 result at ratio 2)
            if p.ratio > 1:
                self.c_wgate = Linear(d, hd, "bf16", gain=0.1)
            self.c_norm = Norm(hd, eps)
            self.ix_wk = Linear(hd, cfg["index_head_dim"], "bf16")
            self.ix_k_norm = Norm(cfg["index_head_dim"], eps)
        if p.is_index_source:
            nh, ihd = cfg["index_n_heads"], cfg["index_head_dim"]
            self.ix_wq_b = Linear(ql, nh * ihd, "fp8")
            self.ix_weights_proj = Linear(d, nh, "bf16")

    # 3.8: compressed latents, then index K and main KV of this KV source
    def compress(self, x, c, rope):
        cfg, r = self.cfg, self.p.ratio
        B, T, _ = x.shape
        if r == 1:
            lat = self.c_norm(self.c_wkv(x, c), c)
        else:
            E = T // r
            kv = self.c_wkv(x[:, :E * r], c, out_bf16=False).reshape(B, E, r, -1)
            sc = self.c_wgate(x[:, :E * r], c, out_bf16=False).reshape(B, E, r, -1)
            lat = rb((kv * torch.softmax(sc, dim=2)).sum(2), c)
            lat = self.c_norm(lat, c)
        E = lat.shape[1]
        cos, sin = rope(self.p, torch.arange(E) * r)
        rd = cfg["rope_head_dim"]
        # the index-K path is trained by the indexer's KL term only
        ik = self.ix_k_norm(self.ix_wk(lat.detach(), c), c)
        ik = rope_tail(ik, rd, cos, sin, c)
        main = rope_tail(lat, rd, cos, sin, c)
        if c.sim:
            ik = ste(ik, q4mx_dq(ik))
            main = ste(main, q4nv_dq(main))
        return main, ik

    def index_scores(self, x, cq, ik, c, cos, sin):
        cfg, r = self.cfg, self.p.ratio
        B, T, _ = x.shape
        nh, ihd = cfg["index_n_heads"], cfg["index_head_dim"]
        x, cq = x.detach(), cq.detach()
        iq = self.ix_wq_b(cq, c).reshape(B, T, nh, ihd)
        iq = rope_tail(iq, cfg["rope_head_dim"], cos[:, None, :], sin[:, None, :], c)
        if c.sim:
            iq = ste(iq, q4mx_dq(iq))
        wt = rb(self.ix_weights_proj(x, c) * (ihd ** -0.5 * nh ** -0.5), c)
        s = rb(torch.einsum("bthd,bed->bthe", iq, ik), c)
        t = rb(F.relu(s) * wt[..., None], c)
        return rb(t.sum(2), c)                                        # [B, T, E]


def visible_mask(T, E, r):
    n_p = (torch.arange(T) + 1) // r
    return torch.arange(E)[None, :] < n_p[:, None], n_p


def candidate_mask(score, vis, n_p, topk_blocks, bs):
    B, T, E = score.shape
    nb = -(-E // bs)
    s = torch.where(vis, score, torch.full_like(score, -float("inf")))
    pad = F.pad(s, (0, nb * bs - E), value=-float("inf"))
    bscore = pad.reshape(B, T, nb, bs).amax(-1)
    last = (n_p - 1) // bs
    pin = (torch.arange(nb)[None, :] == last[:, None]) & (last[:, None] >= 0)
    bscore = torch.where(pin[None], torch.full_like(bscore, float("inf")), bscore)
    k = min(topk_blocks, nb)
    idx = torch.topk(bscore, k, dim=-1).indices
    keep = torch.zeros(B, T, nb, dtype=torch.bool)
    keep.scatter_(2, idx, torch.gather(bscore, 2, idx) > -float("inf"))
    return keep.repeat_interleave(bs, dim=2)[..., :E]


def topk_mask(score, allowed, k):
    B, T, E = score.shape
    s = torch.where(allowed, score, torch.full_like(score, -float("inf")))
    k = min(k, E)
    idx = torch.topk(s, k, dim=-1).indices
    m = torch.zeros(B, T, E, dtype=torch.bool)
    m.scatter_(2, idx, True)
    return m & allowed


def sparse_attention(q, keys_swa, swa_mask, keys_c, c_mask, sink, scale, c):
    """q [B,T,H,d]; keys_swa [B,S,d] with swa_mask [T,S] or [B,T,S]; keys_c [B,E,d] with c_mask
    [B,T,E] (or None); sink [H]. K = V. Returns o [B,T,H,d] and the attention probabilities over
    the compressed entries summed over heads [B,T,E] (or None)."""
    B, T, H, d = q.shape
    s1 = torch.einsum("bthd,bsd->bths", q, keys_swa) * scale
    neg = torch.finfo(s1.dtype).min
    m1 = swa_mask if swa_mask.dim() == 3 else swa_mask[None]
    s1 = s1.masked_fill(~m1[:, :, None, :], neg)
    parts = [s1]
    if keys_c is not None:
        s2 = torch.einsum("bthd,bed->bthe", q, keys_c) * scale
        s2 = s2.masked_fill(~c_mask[:, :, None, :], neg)
        parts.append(s2)
    parts.append(sink.view(1, 1, H, 1).expand(B, T, H, 1))
    p = torch.softmax(torch.cat(parts, dim=-1), dim=-1)
    S = keys_swa.shape[1]
    pv = rb(p, c)
    o = torch.einsum("bths,bsd->bthd", pv[..., :S], keys_swa)
    pc = None
    if keys_c is not None:
        E = keys_c.shape[1]
        o = o + torch.einsum("bthe,bed->bthd", pv[..., S:S + E], keys_c)
        pc = p[..., S:S + E].sum(2)
    return rb(o, c), pc


class Block(nn.Module):
    def __init__(self, cfg, p):
        super().__init__()
        d, eps = cfg["dim"], cfg["norm_eps"]
        self.p = p
        self.attn = Attention(cfg, p)
        self.attn_norm = Norm(d, eps)
        self.ffn_norm = Norm(d, eps)
        self.hc_attn = MHC(cfg)
        self.hc_ffn = MHC(cfg)
        self.ffn = MoE(cfg, p.n_experts, p.n_active)

    def forward(self, X, pre_in, c, attn_fn):
        R = X
        a_pre, a_post, a_C = self.hc_attn(X)
        x = self.attn_norm(apply_pre(X, pre_in, c), c)
        y = attn_fn(self, x)
        X = apply_post(y, R, a_post, a_C, c)
        R = X
        f_pre, f_post, f_C = self.hc_ffn(X)
        x = self.ffn_norm(apply_pre(X, a_pre, c), c)
        y = self.ffn(x, c)
        X = apply_post(y, R, f_post, f_C, c)
        return X, f_pre


class Engram(nn.Module):
    def __init__(self, cfg, rows):
        super().__init__()
        d, hc, hd = cfg["dim"], cfg["hc_mult"], cfg["engram_head_dim"]
        cols = (cfg["engram_max_ngram_size"] - 1) * cfg["engram_n_heads"]
        self.d, self.hc, self.eps = d, hc, cfg["norm_eps"]
        self.table = nn.Parameter(torch.randn(rows, hd) * 0.5)
        self.qk = nn.Parameter(torch.ones(hc, d))
        self.wkv = Linear(cols * hd, (hc + 1) * d, "fp8", gain=0.3)

    def forward(self, X, ids, c):
        B, T, hc, d = X.shape
        tab = ste(self.table, e4m3_row_dq(self.table)) if c.wq else self.table
        rows = F.embedding(ids.reshape(B, T, -1), tab).reshape(B, T, -1)
        rows = rb(rows, c)
        kv = self.wkv(rows, c)
        key = kv[..., :hc * d].reshape(B, T, hc, d)
        value = kv[..., hc * d:]
        qk = ste(self.qk, bf16(self.qk)) if c.wq else self.qk
        rstd = torch.rsqrt((X * X).mean(-1) + self.eps) * torch.rsqrt((key * key).mean(-1) + self.eps)
        S = ((X * qk) * key).sum(-1)
        dot = S * rstd * (d ** -0.5)
        g = torch.sigmoid(torch.sign(dot) * torch.sqrt(dot.abs().clamp(min=1e-6)))
        return rb(X + g[..., None] * value[:, :, None, :], c)


class V41(nn.Module):
    def __init__(self, doc):
        super().__init__()
        cfg = self.cfg = parse_config(doc)
        self.plan = layer_plan(cfg)
        d, V = cfg["dim"], cfg["vocab_size"]
        self.embed = nn.Parameter(torch.randn(V, d) * 1.0)
        self.head = Linear(d, V, "bf16")
        self.norm = Norm(d, cfg["norm_eps"])
        self.blocks = nn.ModuleList([Block(cfg, p) for p in self.plan])
        self.engram_consts = None
        self.engrams = nn.ModuleDict()
        if cfg["engram_layer_ids"]:
            self.engram_consts = EngramConstants(cfg)
            for slot, l in enumerate(cfg["engram_layer_ids"]):
                self.engrams[str(l)] = Engram(cfg, self.engram_consts.rows[slot])
        self.nL = cfg["n_layers"]
        self.has_dspark = cfg["n_mtp_layers"] > 0 and cfg["dspark_block_size"] > 0
        if self.has_dspark:
            nt, rank = len(cfg["dspark_target_layer_ids"]), cfg["dspark_markov_rank"]
            self.main_proj = Linear(d * nt, d, "fp8")
            self.main_norm = Norm(d, cfg["norm_eps"])
            self.mtp_norm = Norm(d, cfg["norm_eps"])
            self.markov_embed = nn.Parameter(torch.randn(V, rank) * 0.1)
            self.markov_head = Linear(rank, V, "bf16", gain=0.1)
            self.conf_proj = Linear(d + rank, 1, "bf16", gain=0.1)
        self.inv = {}
        for p in self.plan:
            key = (p.rope_theta, p.yarn)
            if key not in self.inv:
                self.inv[key] = torch.from_numpy(RA.rope_inv_freq(cfg["rope_head_dim"], p.rope_theta, p.yarn, cfg).astype(np.float32))

    def rope(self, p, pos):
        ang = pos.float()[:, None] * self.inv[(p.rope_theta, p.yarn)][None, :]
        return torch.cos(ang), torch.sin(ang)

    def backbone_params(self):
        return [prm for n, prm in self.named_parameters() if not self._is_draft(n)]

    def draft_params(self):
        return [prm for n, prm in self.named_parameters() if self._is_draft(n)]

    def _is_draft(self, name):
        if name.startswith("blocks."):
            return int(name.split(".")[1]) >= self.nL
        return name.split(".")[0] in ("main_proj", "main_norm", "mtp_norm", "markov_embed", "markov_head", "conf_proj")

    # ---- backbone ----------------------------------------------------------------------------
    def forward(self, tokens, eng_ids, c, want_aux=False):
        """tokens [B, T] (positions 0..T-1); eng_ids [B, T, slots, cols] or None. Returns the FP32
        logits [B, T, V], the indexer KL loss, and (want_aux) main_hidden [B, T, nt*dim]."""
        cfg = self.cfg
        B, T = tokens.shape
        hc, win = cfg["hc_mult"], cfg["window_size"]
        emb = ste(self.embed, bf16(self.embed)) if c.wq else self.embed
        X = emb[tokens][:, :, None, :].expand(B, T, hc, cfg["dim"]).contiguous()
        pre = torch.zeros(B, T, hc)
        pre[..., 0] = 1.0
        i = torch.arange(T)
        swa_mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - win)
        st = {"main": {}, "ik": {}, "topk": {}, "cand": None, "kl": [], "pc": {}}
        aux = []
        pos = torch.arange(T)
        for p in self.plan[:self.nL]:
            blk = self.blocks[p.id]
            if p.engram_slot >= 0:
                X = self.engrams[str(p.id)](X, eng_ids[:, :, p.engram_slot], c)
            if p.is_dspark_target:
                aux.append(rb(X.mean(2), c))

            def attn_fn(b, x, p=p):
                return self._attention(b.attn, p, x, c, st, pos, swa_mask)
            X, pre = blk(X, pre, c, attn_fn)
        h = apply_pre(X, pre, c)
        logits = self.head(self.norm(h, c), c, out_bf16=False)
        kl = torch.stack(st["kl"]).mean() if st["kl"] else torch.zeros(())
        mh = torch.cat(aux, dim=-1) if (want_aux and aux) else None
        return logits, kl, mh

    def _attention(self, A, p, x, c, st, pos, swa_mask):
        cfg = self.cfg
        B, T, _ = x.shape
        H, hd, rd = cfg["n_heads"], cfg["head_dim"], cfg["rope_head_dim"]
        cos, sin = self.rope(p, pos)
        cq = A.q_norm(A.wq_a(x, c), c)
        q = A.wq_b(cq, c).reshape(B, T, H, hd)
        q = rope_tail(q, rd, cos[:, None, :], sin[:, None, :], c)
        k = A.kv_norm(A.wkv(x, c), c)
        k = rope_tail(k, rd, cos, sin, c)
        if c.sim:
            k = ste(k, q8_dq(k))
        keys_c, c_mask = None, None
        if p.ratio > 0:
            r = p.ratio
            if p.is_kv_source:
                st["main"][p.id], st["ik"][p.id] = A.compress(x, c, self.rope)
            E = st["main"][p.kv_source].shape[1]
            vis, n_p = visible_mask(T, E, r)
            vis = vis[None].expand(B, T, E)
            if p.is_index_source:
                score = A.index_scores(x, cq, st["ik"][p.index_k_source], c, cos, sin)
                allowed = vis
                if p.is_candidate_source:
                    st["cand"] = candidate_mask(score.detach(), vis, n_p, cfg["candidate_topk_blocks"], cfg["candidate_block_size"])
                elif p.uses_candidates:
                    allowed = vis & st["cand"]
                st["topk"][p.id] = topk_mask(score.detach(), allowed, cfg["index_topk"])
                st["score"] = (p.id, score, allowed)
            keys_c = st["main"][p.kv_source]
            c_mask = st["topk"][p.topk_source] if c.sparse else vis
        o, pc = sparse_attention(q, k, swa_mask, keys_c, c_mask, A.sink, hd ** -0.5, c)
        if p.ratio > 0 and p.is_index_source and c.want_kl:
            lid, score, allowed = st["score"]
            sel = c_mask if c.sparse else allowed
            tgt = pc.detach() * sel
            tsum = tgt.sum(-1, keepdim=True)
            ok = (tsum[..., 0] > 1e-9) & (sel.sum(-1) > 1)
            tgt = tgt / tsum.clamp(min=1e-9)
            logq = torch.log_softmax(score.masked_fill(~sel, -1e30), dim=-1)
            klrow = (tgt * (torch.log(tgt.clamp(min=1e-12)) - logq)).masked_fill(~sel, 0.0).sum(-1)
            if ok.any():
                st["kl"].append(klrow[ok].mean())
        o = rope_tail(o, rd, cos[:, None, :], sin[:, None, :], c, inverse=True)
        G, R = cfg["o_groups"], cfg["o_lora_rank"]
        og = o.reshape(B, T, G, H // G * hd)
        wa = A.wo_a.w(c).reshape(G, R, H // G * hd)
        z = rb(torch.einsum("btgk,grk->btgr", og, wa), c)
        return A.wo_b(z.reshape(B, T, G * R), c)

    # ---- DSpark (5.1-5.2), teacher-forced ----------------------------------------------------
    def draft(self, tokens, main_hidden, P, c):
        """Draft blocks at target positions P [B, n] (each block: t_{P+1} then noise at P+1..P+bs).
        Returns per block the bs logits [B, n, bs, V] (base + Markov bias with teacher-forced
        previous tokens t_{P+1+k}) and the confidence logits [B, n, bs]."""
        cfg = self.cfg
        B, T = tokens.shape
        n = P.shape[1]
        bs, hc, win, d = cfg["dspark_block_size"], cfg["hc_mult"], cfg["window_size"], cfg["dim"]
        H, hd, rd = cfg["n_heads"], cfg["head_dim"], cfg["rope_head_dim"]
        ctx = self.main_norm(self.main_proj(main_hidden, c), c)               # [B, T, d]
        bidx = torch.arange(B)[:, None]
        first = tokens[bidx, P + 1]                                            # [B, n]
        blk = torch.full((B, n, bs), cfg["dspark_noise_token_id"], dtype=torch.long)
        blk[:, :, 0] = first
        emb = ste(self.embed, bf16(self.embed)) if c.wq else self.embed
        X = emb[blk].reshape(B, n * bs, 1, d).expand(B, n * bs, hc, d).contiguous()
        pre = torch.zeros(B, n * bs, hc)
        pre[..., 0] = 1.0
        qpos = (P[:, :, None] + 1 + torch.arange(bs)[None, None, :])          # [B, n, bs]
        tpos = torch.arange(T)
        ring_mask = (tpos[None, None, :] <= P[:, :, None]) & (tpos[None, None, :] > P[:, :, None] - win)   # [B, n, T]

        def attn_fn(b, x, p):
            A = b.attn
            cc, sc = self.rope(p, tpos)
            kc = A.kv_norm(A.wkv(ctx, c), c)
            kc = rope_tail(kc, rd, cc, sc, c)
            if c.sim:
                kc = ste(kc, q8_dq(kc))
            cos, sin = self.rope(p, qpos.reshape(-1))
            cos, sin = cos.reshape(B, n * bs, -1), sin.reshape(B, n * bs, -1)
            cq = A.q_norm(A.wq_a(x, c), c)
            q = A.wq_b(cq, c).reshape(B, n * bs, H, hd)
            q = rope_tail(q, rd, cos[:, :, None, :], sin[:, :, None, :], c)
            k = A.kv_norm(A.wkv(x, c), c)
            k = rope_tail(k, rd, cos, sin, c)
            if c.sim:
                k = ste(k, q8_dq(k))
            q5 = q.reshape(B, n, bs, H, hd)
            k5 = k.reshape(B, n, bs, hd)
            s1 = torch.einsum("bnqhd,btd->bnqht", q5, kc) * hd ** -0.5
            s1 = s1.masked_fill(~ring_mask[:, :, None, None, :], torch.finfo(s1.dtype).min)
            s2 = torch.einsum("bnqhd,bnkd->bnqhk", q5, k5) * hd ** -0.5
            sk = A.sink.view(1, 1, 1, H, 1).expand(B, n, bs, H, 1)
            pr = torch.softmax(torch.cat([s1, s2, sk], dim=-1), dim=-1)
            pv = rb(pr, c)
            o = torch.einsum("bnqht,btd->bnqhd", pv[..., :T], kc) + torch.einsum("bnqhk,bnkd->bnqhd", pv[..., T:T + bs], k5)
            o = rb(o, c).reshape(B, n * bs, H, hd)
            o = rope_tail(o, rd, cos[:, :, None, :], sin[:, :, None, :], c, inverse=True)
            G, R = cfg["o_groups"], cfg["o_lora_rank"]
            og = o.reshape(B, n * bs, G, H // G * hd)
            wa = A.wo_a.w(c).reshape(G, R, H // G * hd)
            z = rb(torch.einsum("btgk,grk->btgr", og, wa), c)
            return A.wo_b(z.reshape(B, n * bs, G * R), c)

        for p in self.plan[self.nL:]:
            X, pre = self.blocks[p.id](X, pre, c, lambda b, x, p=p: attn_fn(b, x, p))
        h = apply_pre(X, pre, c)                                               # [B, n*bs, d]
        base = self.head(self.mtp_norm(h, c), c, out_bf16=False).reshape(B, n, bs, -1)
        prev = tokens[bidx[:, :, None], (P[:, :, None] + 1 + torch.arange(bs)[None, None, :]).clamp(max=T - 1)]
        me = self.markov_embed[prev]
        if c.wq:
            me = ste(me, bf16(me))
        logits = base + self.markov_head(me, c, out_bf16=False)
        conf = self.conf_proj(torch.cat([h.reshape(B, n, bs, d), me], dim=-1), c, out_bf16=False)[..., 0]
        return logits, conf


# ---- Engram hashing (3.2), vectorised ------------------------------------------------------

def engram_ids(consts, token_map, tokens, pad):
    """tokens [B, T] int64 numpy (a window starting at position 0) -> [B, T, slots, cols] int64,
    the same values as tools/reference/engram.py engram_hash."""
    hist = token_map[tokens]                                                  # [B, T]
    B, T = tokens.shape
    toks = []
    blocked = np.zeros((B, T), dtype=bool)
    for s in range(consts.max_ngram):
        prev = np.full((B, T), -1, dtype=np.int64)
        if s < T:
            prev[:, s:] = hist[:, :T - s]
        blocked = blocked | (np.arange(T)[None, :] < s) | (prev < 0)
        toks.append(np.where(blocked, pad, prev).astype(np.int64))
    out = np.zeros((B, T, len(consts.multipliers), consts.cols), dtype=np.int64)
    with np.errstate(over="ignore"):
        for slot, M in enumerate(consts.multipliers):
            r = toks[0] * np.int64(M[0])
            for n in range(2, consts.max_ngram + 1):
                r = r ^ (toks[n - 1] * np.int64(M[n - 1]))
                for k in range(consts.n_heads):
                    col = (n - 2) * consts.n_heads + k
                    out[:, :, slot, col] = r % consts.flat_primes[slot][col] + consts.offsets[slot][col]
    return out
