"""The vision tower and aligner (docs/vision.md) under the exact-mode contract.

Semantics are those of the official vision.py (S1): patch embedding, a pre-norm ViT with 2D
rotary positions and bidirectional attention, a final RMSNorm, then the aligner (pad the patch
grid to multiples of the downsample ratio r, r x r unshuffle, linear + bias, exact-erf GELU,
linear + bias). Arithmetic follows exact-mode.md plus the vision rules of docs/vision.md:

* a linear with bias is bf16(fl32(dot) + bias): the dot product in double rounded once to FP32,
  then one FP32 addition of the (BF16) bias, then BF16;
* RMSNorm (eps 1e-6) as the text model's (exact.rmsnorm);
* rotary: inv[j] = fp32(1 / fp32(theta^(fp32(2j) / rd))) for j < rd / 2 with rd = head_dim / 2;
  patch (h, w) has angles fp32(h * inv) on the first rd / 2 table entries and fp32(w * inv) on
  the last rd / 2; cos / sin in double rounded once; element i < rd pairs with element i + rd
  (half split): (a, b) -> (fl(fl(a c) - fl(b s)), fl(fl(b c) + fl(a s))), then BF16;
* attention: score fl(fl32(q.k) * fp32(head_dim^-0.5)); the 64-key block recurrence of spec 3.12
  without a sink (m from -1e30, f = exp(m - m_new), den = den f + sum p, acc = acc f + bf16(p).V),
  out = bf16(acc / den);
* residual adds bf16(x + y) in FP32; MLP bf16(bf16(silu(gate)) * up); GELU evaluated in double
  from the FP32 input, rounded once to FP32, then BF16.

Inputs: pixels [3, H, W] BF16 values with H, W multiples of the patch size."""

import json
import math
import os

import numpy as np

from formats import F32, F64, bf16_round
from exact import c32, exp32, sum32, silu32, rmsnorm, linear_f32, linear_bf16
from checkpoint import Checkpoint, CheckpointError
from attention import rope_inv_freq

# HF vision_config key -> flat key
_HF = {"num_hidden_layers": "vision_n_layers", "hidden_size": "vision_dim",
       "num_attention_heads": "vision_n_heads", "intermediate_size": "vision_inter_dim",
       "patch_size": "vision_patch_size", "rope_theta": "vision_rope_theta",
       "downsample_ratio": "vision_downsample_ratio"}
_DEFAULTS = {"vision_n_layers": 0, "vision_dim": 1024, "vision_n_heads": 16, "vision_inter_dim": 2816,
             "vision_patch_size": 14, "vision_rope_theta": 10000.0, "vision_downsample_ratio": 3}

NORM_EPS = 1e-6
BLOCK = 64          # keys per block of the attention recurrence


def vision_config(ckpt_dir):
    """The vision fields (flat names) of DIR/config.json; vision_n_layers 0 when there is none."""
    with open(os.path.join(ckpt_dir, "config.json")) as f:
        doc = json.load(f)
    v = dict(_DEFAULTS)
    if "text_config" in doc or "hidden_size" in doc:
        vc = doc.get("vision_config") or {}
        for k, fk in _HF.items():
            if k in vc:
                v[fk] = vc[k]
    else:
        for k in _DEFAULTS:
            if k in doc:
                v[k] = doc[k]
    return v


def gelu32(x):
    """0.5 x (1 + erf(x / sqrt 2)) in double from the FP32 input, rounded once to FP32."""
    x64 = np.asarray(x, dtype=F32).astype(F64)
    erf = np.vectorize(math.erf, otypes=[F64])
    return (0.5 * x64 * (1.0 + erf(x64 * (1.0 / math.sqrt(2.0))))).astype(F32)


def linear_bias(x, W, b):
    return bf16_round(linear_f32(x, W) + b[None, :])


def vision_cos_sin(n_h, n_w, rd, theta):
    """[n_h * n_w, rd] cos / sin tables, patches in row-major order."""
    inv = rope_inv_freq(rd, theta, False, {"original_seq_len": 0})
    h = np.repeat(np.arange(n_h), n_w).astype(F32)
    w = np.tile(np.arange(n_w), n_h).astype(F32)
    ang = np.concatenate([h[:, None] * inv[None, :], w[:, None] * inv[None, :]], axis=1).astype(F32)
    a64 = ang.astype(F64)
    return np.cos(a64).astype(F32), np.sin(a64).astype(F32)


def rotate_half(x, cos, sin):
    """x [n, H, 2 rd] BF16 values; cos / sin [n, rd]."""
    rd = cos.shape[1]
    a, b = x[..., :rd], x[..., rd:]
    c, s = cos[:, None, :], sin[:, None, :]
    return bf16_round(np.concatenate([(a * c) - (b * s), (b * c) + (a * s)], axis=-1))


def attention(q, k, v, scale):
    """q, k, v [n, H, hd] BF16 values -> [n, H, hd] BF16: the block recurrence, no sink."""
    n, H, hd = q.shape
    q64 = q.transpose(1, 0, 2).astype(F64)                 # [H, n, hd]
    k64 = k.transpose(1, 0, 2).astype(F64)
    v64 = v.transpose(1, 0, 2).astype(F64)
    m = np.full((H, n), F32(-1e30), dtype=F32)
    den = np.zeros((H, n), dtype=F32)
    acc = np.zeros((H, n, hd), dtype=F32)
    for b0 in range(0, n, BLOCK):
        kb, vb = k64[:, b0:b0 + BLOCK], v64[:, b0:b0 + BLOCK]
        s = (np.matmul(q64, kb.transpose(0, 2, 1)).astype(F32) * scale).astype(F32)   # [H, n, B]
        m_new = np.maximum(m, s.max(axis=-1))
        f = exp32(m - m_new)
        p = exp32(s - m_new[:, :, None])
        den = (den * f) + sum32(p, axis=-1)
        pv = np.matmul(bf16_round(p).astype(F64), vb).astype(F32)
        acc = (acc * f[:, :, None]) + pv
        m = m_new
    return bf16_round(acc / den[:, :, None]).transpose(1, 0, 2)


def patchify(pixels, p):
    """[3, H, W] -> [n_h * n_w, 3 p p] (channel, row, column inside the patch)."""
    C, Hpx, Wpx = pixels.shape
    n_h, n_w = Hpx // p, Wpx // p
    x = pixels.reshape(C, n_h, p, n_w, p).transpose(1, 3, 0, 2, 4)
    return np.ascontiguousarray(x.reshape(n_h * n_w, C * p * p)), n_h, n_w


def unshuffle(x, n_h, n_w, r):
    """[n_h * n_w, C] -> [ceil(n_h/r) * ceil(n_w/r), C r r]: zero padding at the bottom / right,
    feature index c r r + ky r + kx, tokens in row-major order."""
    C = x.shape[1]
    gh, gw = -(-n_h // r), -(-n_w // r)
    g = np.zeros((gh * r, gw * r, C), dtype=F32)
    g[:n_h, :n_w] = x.reshape(n_h, n_w, C)
    g = g.reshape(gh, r, gw, r, C).transpose(0, 2, 4, 1, 3)
    return np.ascontiguousarray(g.reshape(gh * gw, C * r * r)), gh, gw


class Vision:
    def __init__(self, ckpt_dir, ck=None):
        self.ck = ck = ck or Checkpoint(ckpt_dir)
        self.v = v = vision_config(ck.dir)
        if v["vision_n_layers"] <= 0:
            raise CheckpointError("%s: config has no vision tower" % ck.dir)
        D, H, I = v["vision_dim"], v["vision_n_heads"], v["vision_inter_dim"]
        p, r, d = v["vision_patch_size"], v["vision_downsample_ratio"], ck.cfg["dim"]
        if D % H or (D // H) % 4:
            raise CheckpointError("%s: vision head dim %d/%d is not a multiple of 4" % (ck.dir, D, H))
        self.hd = D // H
        self.patch_w = ck.plain("vision.patch_embed.proj.weight", (D, 3 * p * p))
        self.patch_b = ck.values("vision.patch_embed.proj.bias", (D,))
        self.blocks = []
        for i in range(v["vision_n_layers"]):
            pre = "vision.blocks.%d." % i
            self.blocks.append({
                "norm1": ck.values(pre + "norm1.weight", (D,)),
                "wqkv": ck.plain(pre + "attn.wqkv.weight", (3 * D, D)),
                "bqkv": ck.values(pre + "attn.wqkv.bias", (3 * D,)),
                "wo": ck.plain(pre + "attn.wo.weight", (D, D)),
                "bo": ck.values(pre + "attn.wo.bias", (D,)),
                "norm2": ck.values(pre + "norm2.weight", (D,)),
                "w1": ck.plain(pre + "mlp.w1.weight", (2 * I, D)),
                "w2": ck.plain(pre + "mlp.w2.weight", (D, I))})
        self.norm = ck.values("vision.norm.weight", (D,))
        self.al_w1 = ck.plain("aligner.w1.weight", (d, D * r * r))
        self.al_b1 = ck.values("aligner.w1.bias", (d,))
        self.al_w2 = ck.plain("aligner.w2.weight", (d, d))
        self.al_b2 = ck.values("aligner.w2.bias", (d,))
        self.image_start = ck.values("image_start", (d,))
        self.image_end = ck.values("image_end", (d,))
        self.image_newline = ck.values("image_newline", (d,))

    def tower(self, pixels):
        """pixels [3, H, W] BF16 values -> (features [n_h * n_w, D] BF16, n_h, n_w)."""
        v = self.v
        D, H, I, hd = v["vision_dim"], v["vision_n_heads"], v["vision_inter_dim"], self.hd
        x, n_h, n_w = patchify(np.asarray(pixels, dtype=F32), v["vision_patch_size"])
        n = x.shape[0]
        x = linear_bias(x, self.patch_w, self.patch_b)
        cos, sin = vision_cos_sin(n_h, n_w, hd // 2, v["vision_rope_theta"])
        scale = c32(hd ** -0.5)
        for B in self.blocks:
            a = rmsnorm(x, B["norm1"], NORM_EPS)
            qkv = linear_bias(a, B["wqkv"], B["bqkv"])
            q = rotate_half(qkv[:, :D].reshape(n, H, hd), cos, sin)
            k = rotate_half(qkv[:, D:2 * D].reshape(n, H, hd), cos, sin)
            o = attention(q, k, qkv[:, 2 * D:].reshape(n, H, hd), scale)
            x = bf16_round(x + linear_bias(o.reshape(n, D), B["wo"], B["bo"]))
            a = rmsnorm(x, B["norm2"], NORM_EPS)
            gu = linear_bf16(a, B["w1"])
            h = bf16_round(bf16_round(silu32(gu[:, :I])) * gu[:, I:])
            x = bf16_round(x + linear_bf16(h, B["w2"]))
        return rmsnorm(x, self.norm, NORM_EPS), n_h, n_w

    def encode(self, pixels):
        """pixels [3, H, W] -> (aligned rows [gh * gw, dim] BF16 values, gh, gw)."""
        feats, n_h, n_w = self.tower(pixels)
        u, gh, gw = unshuffle(feats, n_h, n_w, self.v["vision_downsample_ratio"])
        h = bf16_round(gelu32(linear_bias(u, self.al_w1, self.al_b1)))
        return linear_bias(h, self.al_w2, self.al_b2), gh, gw

    def span(self, pixels):
        """The image span's embeddings [gh * (gw + 1) + 2, dim]: start, each row of aligned tokens
        closed by the newline vector, end."""
        emb, gh, gw = self.encode(pixels)
        rows = [self.image_start]
        for i in range(gh):
            rows.extend(emb[i * gw:(i + 1) * gw])
            rows.append(self.image_newline)
        rows.append(self.image_end)
        return np.stack(rows).astype(F32)
