#!/usr/bin/env -S /usr/bin/python3
"""The semantics of tools/reference/vision.py checked against a second, plain formulation in
torch (Debian's python3-torch) at float64, written from docs/vision.md with torch's own
layout operations: F.unfold for the r x r unshuffle (zero padding through F.pad), the
rotation table built per (row, column) with torch.stack, softmax(q k^T / sqrt(hd)) v as one
matrix, exact-erf F.gelu. The reference rounds to BF16 at every step and this one never does,
so they agree only approximately: each BF16 rounding is 2^-9 relative, a few dozen of them in
series across 2 blocks and the aligner, so RMS(diff) <= 2 % of RMS(ref) (measured about 0.9 %)
-- while a layout mistake (a transposed patch, rows and columns swapped in the rotary table, the
unshuffle's channel order) gives an RMS difference of tens of percent. Prints PASS / FAIL lines.
Runtime about 2 s (skipped with a PASS-less note when torch is missing)."""
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("note: no torch, vision_torch_test skipped")
    sys.exit(0)
from formats import bf16_round     # noqa: E402
from vision import Vision          # noqa: E402


def t64(a):
    return torch.tensor(np.asarray(a, dtype=np.float64))


def lin(x, W, b=None):
    y = x @ t64(W.rows(0, W.N)).T
    return y if b is None else y + t64(b)


def norm(x, w):
    return t64(w) * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)


def plain_span(V, px):
    v = V.v
    D, H, I, p, r = v["vision_dim"], v["vision_n_heads"], v["vision_inter_dim"], v["vision_patch_size"], \
        v["vision_downsample_ratio"]
    hd = D // H
    x = t64(px)
    nh, nw = x.shape[1] // p, x.shape[2] // p
    # patches: [n, 3, p, p] in reading order, flattened channel-first
    patches = x.unfold(1, p, p).unfold(2, p, p)            # [3, nh, nw, p, p]
    patches = patches.permute(1, 2, 0, 3, 4).reshape(nh * nw, 3 * p * p)
    h = lin(patches, V.patch_w, V.patch_b)
    rd = hd // 2
    inv = 1.0 / (float(v["vision_rope_theta"]) ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
    grid = torch.stack(torch.meshgrid(torch.arange(nh), torch.arange(nw), indexing="ij"), -1).reshape(-1, 2)
    ang = torch.cat([grid[:, :1] * inv, grid[:, 1:] * inv], -1).double()   # [n, rd]
    c, s = torch.cos(ang)[:, None], torch.sin(ang)[:, None]

    def rot(t):
        a, b = t[..., :rd], t[..., rd:]
        return torch.cat([a * c - b * s, b * c + a * s], -1)

    n = h.shape[0]
    for B in V.blocks:
        qkv = lin(norm(h, B["norm1"]), B["wqkv"], B["bqkv"]).reshape(n, 3, H, hd)
        q, k, vv = rot(qkv[:, 0]), rot(qkv[:, 1]), qkv[:, 2]
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / hd ** 0.5, -1)
        o = torch.einsum("hqk,khd->qhd", att, vv).reshape(n, D)
        h = h + lin(o, B["wo"], B["bo"])
        gu = lin(norm(h, B["norm2"]), B["w1"])
        h = h + lin(F.silu(gu[:, :I]) * gu[:, I:], B["w2"])
    h = norm(h, V.norm)
    g = h.T.reshape(1, D, nh, nw)
    g = F.pad(g, (0, -nw % r, 0, -nh % r))
    u = F.unfold(g, r, stride=r)[0].T                      # [tokens, D r r]
    gh, gw = g.shape[2] // r, g.shape[3] // r
    e = lin(F.gelu(lin(u, V.al_w1, V.al_b1)), V.al_w2, V.al_b2)
    rows = [t64(V.image_start)]
    for i in range(gh):
        rows += list(e[i * gw:(i + 1) * gw]) + [t64(V.image_newline)]
    rows.append(t64(V.image_end))
    return torch.stack(rows).numpy()


def main():
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        ck = os.path.join(tmp, "ck")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_checkpoint.py"),
                        os.path.join(ROOT, "tests", "configs", "tinyvl"), ck, "--seed", "2", "--vision", "-q"],
                       check=True)
        V = Vision(ck)
        for H, W, seed in ((42, 42, 1), (126, 140, 2), (70, 182, 3)):
            px = bf16_round(np.random.default_rng(seed).uniform(-1, 1, (3, H, W)).astype(np.float32))
            ref = V.span(px).astype(np.float64)
            pl = plain_span(V, px)
            name = "vision_semantics_%dx%d" % (H, W)
            if ref.shape != pl.shape:
                print("FAIL %s: shapes %r vs %r" % (name, ref.shape, pl.shape))
                fails += 1
                continue
            rms = np.sqrt(((ref - pl) ** 2).mean() / (pl ** 2).mean())
            if rms <= 0.02:
                print("PASS %s (RMS ratio %.4f)" % (name, rms))
            else:
                print("FAIL %s: RMS(diff) / RMS = %.4f > 0.02" % (name, rms))
                fails += 1
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
