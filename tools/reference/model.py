"""The V4.1 forward pass of spec sections 3.1-3.16 under the exact-mode contract.

    model = Model(ckpt_dir)
    seq = Sequence(model)
    logits = forward(model, seq, tokens)          # prefill (start 0), decode (T = 1) or extend

Everything per sequence lives in `Sequence` (packed cache records, compressor state, Engram
history, the published index-K pointer of the `official` reading, DSpark context rings)."""

import numpy as np

from formats import F32, bf16_round
from exact import (c32, mean32, sum32, rsqrt32, sigmoid32, silu32, softplus32, exp32, softmax_exact,
                   rmsnorm, linear_quant, linear_f32)
from checkpoint import Checkpoint, CheckpointError
from engram import EngramConstants, engram_hash, engram_module
import attention as A


# ---- weights --------------------------------------------------------------------------------

class Model:
    def __init__(self, ckpt_dir, index_k="own"):
        if index_k not in ("own", "official"):
            raise ValueError("index_k must be own or official")
        self.index_k = index_k
        self.ck = ck = Checkpoint(ckpt_dir)
        self.cfg = cfg = ck.cfg
        self.plan = ck.plan
        d, V = cfg["dim"], cfg["vocab_size"]
        emb = ck.get("embed.weight")
        if emb.dtype != "BF16" or tuple(emb.shape) != (V, d):
            raise CheckpointError("%s: embed.weight is %s %r, expected BF16 %r" % (ck.dir, emb.dtype, emb.shape, (V, d)))
        self.norm = ck.values("norm.weight", (d,))
        self.head = ck.plain("head.weight", (V, d))
        self.layers = [self._layer_weights(p) for p in self.plan]
        self.engram = None
        if cfg["engram_layer_ids"]:
            self.engram = EngramConstants(cfg)
            self.token_map = ck.engram_token_map()
            self.engram_pad = int(self.token_map[cfg["engram_pad_id"]])
            for slot, l in enumerate(cfg["engram_layer_ids"]):
                self.layers[l]["engram"] = self._engram_weights(l, slot)
        self.inv_freq = {}
        for p in self.plan:
            key = (p.rope_theta, p.yarn)
            if key not in self.inv_freq:
                self.inv_freq[key] = A.rope_inv_freq(cfg["rope_head_dim"], p.rope_theta, p.yarn, cfg)
        self.has_dspark = cfg["dspark_block_size"] > 0 and cfg["n_mtp_layers"] > 0
        if self.has_dspark:
            self._dspark_weights()

    def _layer_weights(self, p):
        ck, cfg, pre = self.ck, self.cfg, p.prefix
        d, H, hd = cfg["dim"], cfg["n_heads"], cfg["head_dim"]
        ql, G, R = cfg["q_lora_rank"], cfg["o_groups"], cfg["o_lora_rank"]
        hc = cfg["hc_mult"]
        W = {
            "wq_a": ck.linear(pre + "attn.wq_a", ql, d),
            "q_norm": ck.values(pre + "attn.q_norm.weight", (ql,)),
            "wq_b": ck.linear(pre + "attn.wq_b", H * hd, ql),
            "wkv": ck.linear(pre + "attn.wkv", hd, d),
            "kv_norm": ck.values(pre + "attn.kv_norm.weight", (hd,)),
            "wo_a": ck.values(pre + "attn.wo_a.weight", (G * R, H * hd // G)),
            "wo_b": ck.linear(pre + "attn.wo_b", d, G * R),
            "sink": ck.values(pre + "attn.attn_sink", (H,)),
            "attn_norm": ck.values(pre + "attn_norm.weight", (d,)),
            "ffn_norm": ck.values(pre + "ffn_norm.weight", (d,)),
        }
        if W["wo_a"].dtype != F32 or np.any(bf16_round(W["wo_a"]) != W["wo_a"]):
            raise CheckpointError("%s: %sattn.wo_a does not dequantize to BF16 values" % (ck.dir, pre))
        mix = (2 + hc) * hc
        for s in ("attn", "ffn"):
            W["hc_%s_fn" % s] = ck.plain(pre + "hc_%s_fn" % s, (mix, hc * d))
            W["hc_%s_base" % s] = ck.values(pre + "hc_%s_base" % s, (mix,))
            W["hc_%s_scale" % s] = ck.values(pre + "hc_%s_scale" % s, (3,))
        if p.is_kv_source:
            W["c_wkv"] = ck.plain(pre + "attn.compressor.wkv.weight", (hd, d))
            if p.ratio > 1:
                W["c_wgate"] = ck.plain(pre + "attn.compressor.wgate.weight", (hd, d))
            W["c_norm"] = ck.values(pre + "attn.compressor.norm.weight", (hd,))
            W["ix_wk"] = ck.plain(pre + "attn.indexer.wk.weight", (cfg["index_head_dim"], hd))
            W["ix_k_norm"] = ck.values(pre + "attn.indexer.k_norm.weight", (cfg["index_head_dim"],))
        if p.is_index_source:
            W["ix_wq_b"] = ck.linear(pre + "attn.indexer.wq_b", cfg["index_n_heads"] * cfg["index_head_dim"], ql)
            W["ix_weights_proj"] = ck.plain(pre + "attn.indexer.weights_proj.weight", (cfg["index_n_heads"], d))
        E, I = p.n_experts, cfg["moe_inter_dim"]
        W["gate"] = ck.plain(pre + "ffn.gate.weight", (E, d))
        W["gate_bias"] = ck.values(pre + "ffn.gate.bias", (E,))
        if ck.has(pre + "ffn.gate.bias_vl"):         # image positions route with it (docs/vision.md)
            W["gate_bias_vl"] = ck.values(pre + "ffn.gate.bias_vl", (E,))
        W["experts"] = [{"w1": ck.linear(pre + "ffn.experts.%d.w1" % e, I, d),
                         "w2": ck.linear(pre + "ffn.experts.%d.w2" % e, d, I),
                         "w3": ck.linear(pre + "ffn.experts.%d.w3" % e, I, d)} for e in range(E)]
        W["shared"] = {"w1": ck.linear(pre + "ffn.shared_experts.w1", I, d),
                       "w2": ck.linear(pre + "ffn.shared_experts.w2", d, I),
                       "w3": ck.linear(pre + "ffn.shared_experts.w3", I, d)}
        return W

    def _engram_weights(self, l, slot):
        ck, cfg = self.ck, self.cfg
        pre = "layers.%d.engram." % l
        rows, hd, hc, d = self.engram.rows[slot], cfg["engram_head_dim"], cfg["hc_mult"], cfg["dim"]
        if cfg["engram_num_embeddings"] and cfg["engram_num_embeddings"][slot] != rows:
            raise CheckpointError("config.json: engram_num_embeddings[%d] = %d, but the primes sum to %d"
                                  % (slot, cfg["engram_num_embeddings"][slot], rows))
        t, s = ck.get(pre + "embed.weight"), ck.get(pre + "embed.scale")
        if tuple(t.shape) != (rows, hd) or tuple(s.shape) != (rows, hd // 32):
            raise CheckpointError("%s: %sembed: shape %r / %r, expected %r / %r"
                                  % (ck.dir, pre, t.shape, s.shape, (rows, hd), (rows, hd // 32)))
        qw = ck.values(pre + "q_weight", (hc, d))
        kw = ck.values(pre + "k_weight", (hc, d))
        return {"table": t.data, "table_scale": s.data, "qk": qw * kw,
                "wkv": ck.linear(pre + "wkv", (hc + 1) * d, self.engram.cols * hd)}

    def _dspark_weights(self):
        ck, cfg = self.ck, self.cfg
        d, last = cfg["dim"], cfg["n_mtp_layers"] - 1
        nt, rank = len(cfg["dspark_target_layer_ids"]), cfg["dspark_markov_rank"]
        V = cfg["vocab_size"]
        self.main_proj = ck.linear("mtp.0.main_proj", d, d * nt)
        self.main_norm = ck.values("mtp.0.main_norm.weight", (d,))
        self.mtp_norm = ck.values("mtp.%d.norm.weight" % last, (d,))
        self.markov_embed_name = "mtp.%d.markov_head.embed.weight" % last
        ck.plain(self.markov_embed_name, (V, rank))      # checks dtype and shape
        self.markov_head = ck.plain("mtp.%d.markov_head.head.weight" % last, (V, rank))
        self.conf_proj = ck.plain("mtp.%d.confidence_head.proj.weight" % last, (1, d + rank))

    def embed(self, tokens):
        """BF16 embedding rows (FP32 values) of the token ids."""
        return self.ck.rows("embed.weight", np.asarray(tokens, dtype=np.int64), None)

    def markov_embed(self, token):
        return self.ck.rows(self.markov_embed_name, np.array([token]), None)

    def rope_tables(self, p, positions):
        return A.rope_cos_sin(self.inv_freq[(p.rope_theta, p.yarn)], positions)


# ---- per-sequence state ---------------------------------------------------------------------

class Sequence:
    def __init__(self, model):
        cfg = model.cfg
        self.pos = 0
        self.hist = []                 # Engram: compressed id of every position
        win, hd = cfg["window_size"], cfg["head_dim"]
        self.rings = [A.SwaRing(win, hd) for _ in model.plan]       # backbone layers and draft stages
        self.main, self.ik, self.comp = {}, {}, {}
        for p in model.plan:
            if p.is_kv_source:
                self.main[p.id] = A.EntryCache("main", hd)
                self.ik[p.id] = A.EntryCache("ik", cfg["index_head_dim"])
                if p.ratio > 1:
                    self.comp[p.id] = A.CompressorState(p.ratio, hd)
        self.published = None          # `official` reading: the owner whose index K is current


class Trace:
    """What a forward appends to the trace (docs/conformance.md). Rows a layer did not compute
    (ced-replay: the `skipped` leading rows of the layers after the cut) are written as -1."""

    def __init__(self):
        self.topk = {}       # layer -> list of int32 arrays
        self.experts = {}

    @staticmethod
    def _record(sel, skipped):
        T, k = sel.shape
        rows = np.concatenate([np.full((skipped, k), -1, dtype=np.int64), sel]) if skipped else sel
        return np.concatenate([[T + skipped, k], rows.reshape(-1)]).astype("<i4")

    def add_topk(self, l, sel, skipped=0):
        self.topk.setdefault(l, []).append(self._record(sel, skipped))

    def add_experts(self, l, sel, skipped=0):
        self.experts.setdefault(l, []).append(self._record(sel, skipped))


# ---- 3.4 mHC --------------------------------------------------------------------------------

def mhc_mixes(X, fn, base, scale, cfg):
    """pre [T, hc], post [T, hc], C [T, hc, hc] (all FP32) from the stream X [T, hc, dim]."""
    T, hc, d = X.shape
    eps = c32(cfg["hc_eps"])
    x = X.reshape(T, hc * d)
    m = linear_f32(x, fn) * rsqrt32(mean32(x * x) + c32(cfg["norm_eps"]))[:, None]
    pre = sigmoid32(m[:, :hc] * scale[0] + base[:hc]) + eps
    post = F32(2) * sigmoid32(m[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    C = (m[:, 2 * hc:] * scale[2] + base[2 * hc:]).reshape(T, hc, hc)
    E = exp32(C - C.max(axis=-1, keepdims=True))
    C = E / sum32(E, axis=-1)[:, :, None] + eps
    C = C / (sum32(C, axis=-2)[:, None, :] + eps)
    for _ in range(cfg["hc_sinkhorn_iters"] - 1):
        C = C / (sum32(C, axis=-1)[:, :, None] + eps)
        C = C / (sum32(C, axis=-2)[:, None, :] + eps)
    return pre, post, C


def mhc_apply_pre(X, pre):
    return bf16_round(sum32(pre[:, :, None] * X, axis=1))


def mhc_apply_post(y, R, post, C):
    """out[j] = bf16( post[j]*y + sum_i C[i][j]*R[i] )."""
    mixed = sum32(C[:, :, :, None] * R[:, :, None, :], axis=1)      # [T, j, d]
    return bf16_round(post[:, :, None] * y[:, None, :] + mixed)


# ---- 3.5-3.13 attention of one layer --------------------------------------------------------

class Forward:
    """Per-forward shared runtime: top-k lists by index source, the candidate pool."""

    def __init__(self, start, T, kind=None):
        self.start, self.T = start, T
        self.kind = kind or ("prefill" if start == 0 else ("decode" if T == 1 else "extend"))
        self.positions = np.arange(start, start + T)
        self.topk = {}
        self.cand = None
        self.skipped = 0            # ced-replay: leading prompt rows this forward no longer carries


def attention_layer(model, seq, fw, p, x, trace):
    """Attention of backbone layer p on its normalised input x [T, dim]. The KV list is
    [SWA part ; compressed entries 0..E-1 of the KV source]; `lst` indexes it per query."""
    cfg, W = model.cfg, model.layers[p.id]
    win, P, T = cfg["window_size"], fw.start, fw.T
    cos, sin = model.rope_tables(p, fw.positions)
    cq, q = A.query_path(W, x, cfg, cos, sin)                       # 3.5
    codes, scales, k = A.swa_kv(W, x, cfg, cos, sin)                # 3.7
    ring = seq.rings[p.id]
    # SWA part of the list (3.11; extend layout of docs/conformance.md)
    if fw.kind == "prefill":
        rows, lst = k, A.swa_list_prefill(T, win)
    elif fw.kind == "decode":
        ring.write(P % win, codes[0], scales[0])
        rows, lst = ring.values.copy(), A.swa_list_decode(P, win)
    else:
        pos = A.swa_list_extend(P, T, win)
        rows = np.concatenate([ring.values, k])
        lst = np.where(pos < 0, -1, np.where(pos < P, pos % win, win + pos - P))
    if fw.kind != "decode":
        for t in range(max(0, T - win), T):
            ring.write((P + t) % win, codes[t], scales[t])
    n_swa = rows.shape[0]

    if p.ratio > 0:
        r = p.ratio
        E = (P + T) // r                    # compressed entries existing after this forward
        if p.is_kv_source:                  # 3.8: new entries (index K first, then main KV)
            j0, c = A.compressor(W, x, r, P, seq.comp.get(p.id), cfg, fw.kind == "decode")
            if c is not None:
                A.emit_entries(W, c, j0, r, cfg, model.inv_freq[(p.rope_theta, p.yarn)],
                               seq.main[p.id], seq.ik[p.id])
                seq.published = p.id
        if p.is_index_source:               # 3.9-3.10; an empty list while no entry exists
            if E == 0:
                sel = np.zeros((T, 0), dtype=np.int64)
            else:
                src = p.index_k_source if model.index_k == "own" else seq.published
                if src is None:
                    raise RuntimeError("layer %d: no index K published yet" % p.id)
                score, n_p = A.indexer_scores(W, x, cq, fw.positions, seq.ik[src].values[:E], r, cfg, cos, sin)
                if p.is_candidate_source:
                    fw.cand = A.candidate_blocks(score, n_p, cfg["candidate_topk_blocks"], cfg["candidate_block_size"])
                elif p.uses_candidates:
                    score = np.where(fw.cand, score, A.NEG_INF).astype(F32)
                sel = A.select_topk(score, n_p, min(cfg["index_topk"], E))
            fw.topk[p.id] = sel
            if trace is not None:
                trace.add_topk(p.id, sel, fw.skipped)
        sel = fw.topk[p.topk_source]        # Reuse layers take their source's list unchanged
        rows = np.concatenate([rows, seq.main[p.kv_source].values[:E]])
        lst = np.concatenate([np.broadcast_to(lst, (T, lst.shape[1])), np.where(sel < 0, -1, sel + n_swa)], axis=1)
    lst = np.broadcast_to(lst, (T, lst.shape[1]))
    o = A.sparse_attention(q, rows, lst, W["sink"], c32(cfg["head_dim"] ** -0.5))     # 3.12
    return A.output_projection(W, o, cfg, cos, sin)                                   # 3.13


# ---- 3.14 MoE -------------------------------------------------------------------------------

def expert_ffn(E, x, lim, weight=None):
    a = linear_quant(x, E["w1"])
    b = linear_quant(x, E["w3"])
    if lim > 0:
        b = np.clip(b, F32(-lim), F32(lim))
        a = np.minimum(a, F32(lim))
    u = silu32(a) * b
    if weight is not None:
        u = weight * u
    return linear_quant(bf16_round(u), E["w2"])


def moe(model, p, x, img=None):
    """Returns the BF16 output and the chosen expert ids per row (ascending). img [T] bool: image
    positions, whose selection uses gate.bias_vl."""
    cfg, W = model.cfg, model.layers[p.id]
    logit = linear_f32(x, W["gate"]) / c32(cfg["gate_temp"])
    sf = cfg["score_func"]
    if sf == "sqrtsoftplus":
        score = np.sqrt(softplus32(logit))
    elif sf == "sigmoid":
        score = sigmoid32(logit)
    elif sf == "softmax":
        score = softmax_exact(logit, axis=-1)
    else:
        raise CheckpointError("config.json: unknown score_func %r" % sf)
    bias = np.broadcast_to(W["gate_bias"][None, :], score.shape)
    if img is not None and img.any():
        if "gate_bias_vl" not in W:
            raise CheckpointError("%s: image positions need %sffn.gate.bias_vl" % (model.ck.dir, p.prefix))
        bias = np.where(img[:, None], W["gate_bias_vl"][None, :], bias)
    sel = A.stable_topk_desc(score + bias, p.n_active)      # routing rank order
    w = np.take_along_axis(score, sel, axis=-1)
    if cfg["norm_topk_prob"] and p.n_active > 1:
        w = w / (sum32(w, axis=-1) + c32(1e-20))[:, None]
    w = w * c32(cfg["route_scale"])
    lim = cfg["swiglu_limit"]
    y = np.zeros(x.shape, dtype=F32)
    for e in np.unique(sel):                      # ascending expert id, not routing rank
        rows, ranks = np.nonzero(sel == e)
        y[rows] = y[rows] + expert_ffn(W["experts"][e], x[rows], lim, w[rows, ranks][:, None])
    y = y + expert_ffn(W["shared"], x, lim)
    return bf16_round(y), np.sort(sel, axis=-1)


# ---- 3.4 block ------------------------------------------------------------------------------

def block(model, seq, fw, p, X, pre_in, trace, attn=None, img=None):
    """One block with the delayed mHC hand-off; attn replaces the backbone attention (DSpark);
    img [T] bool marks image positions (bias_vl routing)."""
    cfg, W = model.cfg, model.layers[p.id]
    eps = cfg["norm_eps"]
    R = X
    a_pre, a_post, a_C = mhc_mixes(X, W["hc_attn_fn"], W["hc_attn_base"], W["hc_attn_scale"], cfg)
    x = rmsnorm(mhc_apply_pre(X, pre_in), W["attn_norm"], eps)
    y = attn(p, x) if attn is not None else attention_layer(model, seq, fw, p, x, trace)
    X = mhc_apply_post(y, R, a_post, a_C)
    R = X
    f_pre, f_post, f_C = mhc_mixes(X, W["hc_ffn_fn"], W["hc_ffn_base"], W["hc_ffn_scale"], cfg)
    x = rmsnorm(mhc_apply_pre(X, a_pre), W["ffn_norm"], eps)
    y, chosen = moe(model, p, x, img)
    if trace is not None and not p.draft:
        trace.add_experts(p.id, chosen, fw.skipped if fw is not None else 0)
    X = mhc_apply_post(y, R, f_post, f_C)
    return X, f_pre


# ---- 3.1 top level --------------------------------------------------------------------------

def one_hot_pre(T, hc):
    pre = np.zeros((T, hc), dtype=F32)
    pre[:, 0] = 1
    return pre


def forward(model, seq, tokens, trace=None, replay=False, image=None):
    """One forward over tokens at positions seq.pos .. seq.pos+T-1. Returns the FP32 logits of the
    last row and main_hidden [rows, n_targets*dim] (BF16; None without DSpark targets) for the
    rows the target layers ran on (all rows, or the replayed ones).

    replay=True (prompt at start 0 only) is the `ced-replay` approximation of spec 4.1: every
    layer up to the last KV source (the first decoder layer, whose compressor makes the
    decoder's global KV) on all N rows, exactly; every later layer only on the last window rows
    s = N - window .. N-1, laid out as a one-shot prefill of those rows (SWA truncated to [s, i];
    compressed KV, index K, top-k and candidates as computed over all rows). The first decoder
    layer itself is exact, as in vLLM / Ascend (spec 4.1, 10.6).

    image = (mask [T] bool, emb [T, dim]) makes the masked rows image positions (docs/vision.md):
    their embedding is emb's row, they route with gate.bias_vl, and Engram treats them as dead
    tokens (gate 0; no n-gram reaches across them)."""
    cfg = model.cfg
    tokens = np.asarray(tokens, dtype=np.int64)
    T = tokens.shape[0]
    if T == 0:
        raise ValueError("empty forward")
    if tokens.min() < 0 or tokens.max() >= cfg["vocab_size"]:
        raise ValueError("token id outside [0, %d)" % cfg["vocab_size"])
    fw = Forward(seq.pos, T)
    img = None
    if image is not None:
        img = np.asarray(image[0], dtype=bool)
        if img.shape != (T,) or not img.any():
            img = None
        elif replay:
            raise ValueError("image rows with the ced-replay approximation")
    H = None
    if model.engram is not None:
        seq.hist.extend(-1 if img is not None and img[t] else int(c)
                        for t, c in enumerate(model.token_map[tokens]))
        H = engram_hash(model.engram, seq.hist, fw.positions, model.engram_pad)
    hc, d = cfg["hc_mult"], cfg["dim"]
    e = model.embed(tokens)
    if img is not None:
        e = np.where(img[:, None], np.asarray(image[1], dtype=F32), e)
    X = np.repeat(e[:, None, :], hc, axis=1)
    pre = one_hot_pre(T, hc)
    aux = []
    win = cfg["window_size"]
    replay = replay and fw.kind == "prefill" and T > win and bool(cfg["kv_source_layers"])
    first_replayed = max(cfg["kv_source_layers"]) + 1 if replay else -1
    for p in model.plan[:cfg["n_layers"]]:
        if p.id == first_replayed:
            X, pre, H, fw = replay_cut(fw, X, pre, H, T - win)
        if p.engram_slot >= 0:
            X = engram_module(X, H[:, p.engram_slot], model.layers[p.id]["engram"], cfg["norm_eps"], d, img)
        if p.is_dspark_target:
            aux.append(bf16_round(mean32(X, axis=1)))
        X, pre = block(model, seq, fw, p, X, pre, trace, img=img)
    h = mhc_apply_pre(X[-1:], pre[-1:])
    logits = linear_f32(rmsnorm(h, model.norm, cfg["norm_eps"]), model.head)[0]
    seq.pos += T
    main_hidden = np.concatenate(aux, axis=-1) if aux else None
    return logits, main_hidden


def replay_cut(fw, X, pre, H, s):
    """ced-replay: keep rows s.. of the stream and of the per-query results computed so far."""
    rfw = Forward(fw.start + s, fw.T - s, kind="prefill")
    rfw.topk = {l: sel[s:] for l, sel in fw.topk.items()}
    rfw.cand = fw.cand[s:] if fw.cand is not None else None
    rfw.skipped = s
    return X[s:], pre[s:], (H[s:] if H is not None else None), rfw


def argmax_first(v):
    return int(np.argmax(v))      # numpy returns the first maximum
