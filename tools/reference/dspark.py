"""DSpark draft forward (spec 5.1-5.2): context projection from the input streams of the target
layers, draft blocks with their context rings, Markov head and confidence head."""

import numpy as np

from formats import F32
from exact import c32, rmsnorm, linear_quant, linear_f32
import attention as A
from model import block, mhc_apply_pre, one_hot_pre


def context(model, main_hidden):
    """ctx = rmsnorm(main_proj(main_hidden)) for each row [T, dim]."""
    return rmsnorm(linear_quant(main_hidden, model.main_proj), model.main_norm, model.cfg["norm_eps"])


def stage_plans(model):
    return model.plan[model.cfg["n_layers"]:]


def seed_rings(model, seq, main_hidden, start):
    """After a prompt forward over positions start .. start+T-1: write every stage's context ring
    (slots p mod window, in position order) with SWA-K(ctx) of its own weights (5.1 prefill)."""
    cfg = model.cfg
    win = cfg["window_size"]
    ctx = context(model, main_hidden)
    positions = np.arange(start, start + ctx.shape[0])
    for p in stage_plans(model):
        W = model.layers[p.id]
        cos, sin = model.rope_tables(p, positions)
        codes, scales, _ = A.swa_kv(W, ctx, cfg, cos, sin)
        for t in range(max(0, ctx.shape[0] - win), ctx.shape[0]):
            seq.rings[p.id].write(positions[t] % win, codes[t], scales[t])


def propose(model, seq, P, main_hidden_P, next_token):
    """5.2 at the target step that processed position P and sampled next_token (= t_{P+1}).
    Returns (block_size proposed ids, block_size raw confidence logits). Greedy (temperature 0)."""
    cfg = model.cfg
    if P < 1:
        raise ValueError("DSpark proposals need P >= 1")
    win, bs, hc = cfg["window_size"], cfg["dspark_block_size"], cfg["hc_mult"]
    ctx = context(model, main_hidden_P.reshape(1, -1))
    blk = np.array([next_token] + [cfg["dspark_noise_token_id"]] * (bs - 1), dtype=np.int64)
    X = np.repeat(model.embed(blk)[:, None, :], hc, axis=1)
    pre = one_hot_pre(bs, hc)
    qpos = np.arange(P + 1, P + 1 + bs)
    n_ring = min(win, P + 1)
    lst = np.concatenate([np.arange(n_ring), win + np.arange(bs)])
    lst = np.broadcast_to(lst, (bs, lst.shape[0]))

    def draft_attention(p, x):
        W = model.layers[p.id]
        ring = seq.rings[p.id]
        ccos, csin = model.rope_tables(p, np.array([P]))
        codes, scales, _ = A.swa_kv(W, ctx, cfg, ccos, csin)
        ring.write(P % win, codes[0], scales[0])          # context key of P, before the attention
        cos, sin = model.rope_tables(p, qpos)
        _, q = A.query_path(W, x, cfg, cos, sin)
        _, _, k = A.swa_kv(W, x, cfg, cos, sin)
        rows = np.concatenate([ring.values, k])
        o = A.sparse_attention(q, rows, lst, W["sink"], c32(cfg["head_dim"] ** -0.5))
        return A.output_projection(W, o, cfg, cos, sin)

    for p in stage_plans(model):
        X, pre = block(model, seq, None, p, X, pre, None, attn=draft_attention)
    h = mhc_apply_pre(X, pre)                                      # [bs, dim] BF16
    base = linear_f32(rmsnorm(h, model.mtp_norm, cfg["norm_eps"]), model.head)
    out = [int(next_token)]
    conf = np.zeros(bs, dtype=F32)
    for k in range(bs):
        me = model.markov_embed(out[k])
        logits_k = base[k] + linear_f32(me, model.markov_head)[0]
        out.append(int(np.argmax(logits_k)))
        conf[k] = linear_f32(np.concatenate([h[k:k + 1], me], axis=1), model.conf_proj)[0, 0]
    return np.array(out[1:], dtype=np.int64), conf
