#!/usr/bin/env python3
"""Trains the demo model's vision tower (docs/vision.md: patch 14, 2D rotary ViT, 3 x 3
unshuffle, two-layer aligner to width 192, image start / end / newline vectors) on generated
scenes (vision_data.py), with the language model frozen at its released weights, so that every
text weight of models/demo stays bit for bit as it is.

    nice -n 19 python3 tools/train/vision_train.py --minutes 40     # resumable: a rerun continues

The prompt is the chat template with the image span first in the user message:

    <BOS><User> [start, (tok tok tok, newline) x 3, end] QUESTION <Assistant></think> ANSWER <EOS>

every span position carrying image_token_id; the loss is the cross-entropy of ANSWER and EOS,
plus (--ground) a grounding term: each cell's aligned token, read through the frozen embedding
matrix as a classifier (cosine similarity x 10, so that it steers directions, not norms), predicts the tokens of the colour, shape and position words of the shape
drawn in that cell (the frozen model copies words from the user message well: its chat data
answers "What does WORD mean?" starting with WORD, so image tokens that look like the words
are easy for it to use).
The language model runs as ds41 runs it for an image (docs/vision.md "Image span"): the span's
embeddings replace the token embeddings, its Engram gate is 0 and it is dead in the n-gram
history. The routers' bias_vl is exported equal to bias (selection is not differentiable and the
frozen experts were balanced on text), so the routing needs nothing here.

The tower runs in FP32 (ds41 runs the exported BF16 weights); the language model runs with the
release numerics simulated (v41.Ctx sim: the BF16 roundings and Q8 activations ds41 computes)
on the weights the committed safetensors decode to. Checkpoints (OUT/vision_state.pt) every
--save-every steps and at the end."""

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import v41  # noqa: E402
import vision_data  # noqa: E402
from export import load_release  # noqa: E402

IMAGE_TOKEN_ID = 16            # <｜deepseek_image｜>, a special token the text never produces
VISION = {"num_hidden_layers": 2, "hidden_size": 96, "num_attention_heads": 4, "intermediate_size": 192,
          "patch_size": 14, "rope_theta": 10000, "downsample_ratio": 3}
BOS, EOS, USER, ASSISTANT, END_THINK = 0, 1, 3, 4, 8


# ---- the tower (FP32 twin of tools/reference/vision.py) -------------------------------------

class LinearB(nn.Module):
    def __init__(self, n_in, n_out, bias=True, gain=1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * (gain / math.sqrt(n_in)))
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6))


def rot_tables(n_h, n_w, rd, theta):
    """[n_h n_w, rd] cos / sin: row angles on the first rd/2 entries, column angles on the rest."""
    inv = 1.0 / (theta ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
    h = torch.arange(n_h, dtype=torch.float64).repeat_interleave(n_w)
    w = torch.arange(n_w, dtype=torch.float64).repeat(n_h)
    ang = torch.cat([h[:, None] * inv[None, :], w[:, None] * inv[None, :]], dim=1)
    return torch.cos(ang).float(), torch.sin(ang).float()


def rotate(x, cos, sin):
    """x [B, n, H, hd]: element e < hd/2 pairs with e + hd/2."""
    rd = cos.shape[-1]
    a, b = x[..., :rd], x[..., rd:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


class Block(nn.Module):
    def __init__(self, D, H, I):
        super().__init__()
        self.H, self.I = H, I
        self.norm1, self.norm2 = RMSNorm(D), RMSNorm(D)
        self.wqkv = LinearB(D, 3 * D)
        self.wo = LinearB(D, D, gain=0.5)
        self.w1 = LinearB(D, 2 * I, bias=False)
        self.w2 = LinearB(I, D, bias=False, gain=0.5)

    def forward(self, x, cos, sin):
        B, n, D = x.shape
        hd = D // self.H
        q, k, v = self.wqkv(self.norm1(x)).split(D, dim=-1)
        q = rotate(q.reshape(B, n, self.H, hd), cos, sin).transpose(1, 2)
        k = rotate(k.reshape(B, n, self.H, hd), cos, sin).transpose(1, 2)
        v = v.reshape(B, n, self.H, hd).transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-1, -2) * hd ** -0.5, dim=-1) @ v
        x = x + self.wo(a.transpose(1, 2).reshape(B, n, D))
        g, u = self.w1(self.norm2(x)).split(self.I, dim=-1)
        return x + self.w2(F.silu(g) * u)


class Tower(nn.Module):
    def __init__(self, vc, dim):
        super().__init__()
        D, H, I, p, r = (vc["hidden_size"], vc["num_attention_heads"], vc["intermediate_size"],
                         vc["patch_size"], vc["downsample_ratio"])
        self.p, self.r, self.D, self.theta = p, r, D, float(vc["rope_theta"])
        self.hd = D // H
        self.patch = LinearB(3 * p * p, D)
        self.blocks = nn.ModuleList([Block(D, H, I) for _ in range(vc["num_hidden_layers"])])
        self.norm = RMSNorm(D)
        self.al1 = LinearB(D * r * r, dim)
        self.al2 = LinearB(dim, dim)
        self.image_start = nn.Parameter(torch.randn(dim))
        self.image_end = nn.Parameter(torch.randn(dim))
        self.image_newline = nn.Parameter(torch.randn(dim))

    def forward(self, px, want_grid=False):
        """px [B, 3, H, W] -> span embeddings [B, gh (gw + 1) + 2, dim] (want_grid: and the aligned
        tokens [B, gh, gw, dim])."""
        B, C, Hp, Wp = px.shape
        p, r, D = self.p, self.r, self.D
        nh, nw = Hp // p, Wp // p
        x = px.reshape(B, C, nh, p, nw, p).permute(0, 2, 4, 1, 3, 5).reshape(B, nh * nw, C * p * p)
        x = self.patch(x)
        cos, sin = rot_tables(nh, nw, self.hd // 2, self.theta)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        x = self.norm(x)
        gh, gw = -(-nh // r), -(-nw // r)
        g = x.new_zeros(B, gh * r, gw * r, D)
        g[:, :nh, :nw] = x.reshape(B, nh, nw, D)
        u = g.reshape(B, gh, r, gw, r, D).permute(0, 1, 3, 5, 2, 4).reshape(B, gh, gw, D * r * r)
        tok = self.al2(F.gelu(self.al1(u)))                                  # [B, gh, gw, dim]
        nl = self.image_newline.expand(B, gh, 1, -1)
        rows = torch.cat([tok, nl], dim=2).reshape(B, gh * (gw + 1), -1)
        span = torch.cat([self.image_start.expand(B, 1, -1), rows, self.image_end.expand(B, 1, -1)], dim=1)
        return (span, tok) if want_grid else span


def pixels(im):
    """PIL RGB -> [3, H, W] FP32 holding the processor's BF16 values ((x/255 - 0.5)/0.5)."""
    a = torch.from_numpy(np.asarray(im, dtype=np.float32)).permute(2, 0, 1)
    return ((a / 255.0 - 0.5) / 0.5).to(torch.bfloat16).float()


# ---- the frozen language model with an image span --------------------------------------------

def lm_forward(model, tokens, span, span_at, eng_ids, c):
    """V41.forward with the span's embeddings at positions span_at .. span_at + S - 1 and their
    Engram gates 0 (docs/vision.md). tokens [B, T]; span [B, S, dim]. -> logits [B, T, V]."""
    cfg = model.cfg
    B, T = tokens.shape
    S = span.shape[1]
    hc = cfg["hc_mult"]
    emb = model.embed[tokens]
    emb = torch.cat([emb[:, :span_at], span, emb[:, span_at + S:]], dim=1)
    if c.sim:
        emb = v41.ste(emb, v41.bf16(emb))
    X = emb[:, :, None, :].expand(B, T, hc, cfg["dim"]).contiguous()
    pre = torch.zeros(B, T, hc)
    pre[..., 0] = 1.0
    i = torch.arange(T)
    swa_mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - cfg["window_size"])
    img = torch.zeros(1, T, 1, 1, dtype=torch.bool)
    img[:, span_at:span_at + S] = True
    st = {"main": {}, "ik": {}, "topk": {}, "cand": None, "kl": [], "pc": {}}
    pos = torch.arange(T)
    for p in model.plan[:model.nL]:
        if p.engram_slot >= 0:
            X = torch.where(img, X, model.engrams[str(p.id)](X, eng_ids[:, :, p.engram_slot], c))

        def attn_fn(b, x, p=p):
            return model._attention(b.attn, p, x, c, st, pos, swa_mask)
        X, pre = model.blocks[p.id](X, pre, c, attn_fn)
    h = v41.apply_pre(X, pre, c)
    return model.head(model.norm(h, c), c, out_bf16=False)


class Tokens:
    """ds41 tokenize, cached (the questions and answers come from a small set)."""

    def __init__(self, ds41, model_dir):
        self.ds41, self.dir, self.cache = ds41, model_dir, {}

    def __call__(self, text):
        if text not in self.cache:
            out = subprocess.run([self.ds41, "tokenize", "-m", self.dir, "--no-bos", "--", text],
                                 stdout=subprocess.PIPE, check=True).stdout
            self.cache[text] = [int(x) for x in out.split()]
        return self.cache[text]


def layout(tok, question, answer, S):
    """-> (ids, span_at, first answer position): BOS User span question Assistant </think> answer EOS"""
    head = [BOS, USER] + [IMAGE_TOKEN_ID] * S + tok(question) + [ASSISTANT, END_THINK]
    return head + tok(answer) + [EOS], 2, len(head)


def cell_words(tok, objs, V):
    """The grounding target of each 3 x 3 cell [9, V]: equal weights on the tokens of the colour,
    the shape and the position words of the shape drawn there (as the answers spell them);
    empty cells get none (all zero)."""
    t = torch.zeros(9, V)
    for shape, colour, cell, *_ in objs:
        ids = tok(colour) + tok(shape) + tok(vision_data.CELLS[cell])
        for i in ids:
            t[cell, i] += 1.0 / len(ids)
    return t


def batch(rng, tok, n, S, V):
    ims, seqs, words = [], [], []
    for _ in range(n):
        im, kind, q, a, objs = vision_data.sample(rng)
        ids, at, first = layout(tok, q, a, S)
        ims.append(pixels(im))
        seqs.append((ids, first))
        words.append(cell_words(tok, objs, V))
    T = max(len(s) for s, _ in seqs)
    ids = torch.full((n, T), EOS, dtype=torch.long)
    tgt = torch.full((n, T), -100, dtype=torch.long)
    for b, (s, first) in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(s)
        tgt[b, first - 1:len(s) - 1] = torch.tensor(s[first:])
    return torch.stack(ims), ids, tgt, torch.stack(words)


class LM:
    """The frozen demo model and what its forward needs."""

    def __init__(self, model_dir, sim=True):
        with open(os.path.join(model_dir, "config.json")) as f:
            doc = json.load(f)
        self.model = v41.V41(doc)
        self.model.load_state_dict(load_release(self.model, model_dir))
        self.model.eval()
        for prm in self.model.parameters():
            prm.requires_grad_(False)
        tm = np.fromfile(os.path.join(model_dir, "engram_token_map.i32"), dtype="<i4").astype(np.int64)
        self.pad = int(tm[self.model.cfg["engram_pad_id"]])
        self.tmap = np.concatenate([tm, [-1]])       # the extra id: a dead history entry
        self.dead = len(tm)
        self.c = v41.Ctx(sim=sim, wq=False, sparse=True)

    def logits(self, span, ids, span_at):
        x = ids.numpy().copy()
        x[:, span_at:span_at + span.shape[1]] = self.dead
        eng = torch.from_numpy(v41.engram_ids(self.model.engram_consts, self.tmap, x, self.pad))
        return lm_forward(self.model, ids, span, span_at, eng, self.c)


def span_len(S_grid):
    gh, gw = S_grid
    return gh * (gw + 1) + 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="models/demo")
    ap.add_argument("--out", default="build/demo-vision")
    ap.add_argument("--ds41", default="build/ds41")
    ap.add_argument("--minutes", type=float, default=40.0, help="stop after this much wall time (this run)")
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--save-every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-sim", action="store_true", help="run the language model in plain FP32")
    ap.add_argument("--ground", type=float, default=0.3,
                    help="weight of the grounding loss: each cell's aligned token, read through the frozen "
                         "embedding matrix as a classifier (cosine similarity x 10, so that it steers directions, not norms), predicts the words of the shape drawn there")
    ap.add_argument("--ground-only", action="store_true",
                    help="train the grounding term alone (no language-model pass: fast); a pre-phase")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    os.makedirs(a.out, exist_ok=True)
    lm = LM(a.model, sim=not a.no_sim)
    dim = lm.model.cfg["dim"]
    torch.manual_seed(a.seed)
    tower = Tower(VISION, dim)
    with torch.no_grad():                         # delimiters start at the text embeddings' scale
        rms = lm.model.embed.pow(2).mean().sqrt()
        for v in (tower.image_start, tower.image_end, tower.image_newline):
            v.mul_(rms)
    opt = torch.optim.Adam(tower.parameters(), lr=a.lr)
    step, log = 0, []
    path = os.path.join(a.out, "vision_state.pt")
    if os.path.exists(path):
        st = torch.load(path)
        tower.load_state_dict(st["tower"])
        opt.load_state_dict(st["opt"])
        step, log = st["step"], st["log"]
        print("resumed at step %d" % step, flush=True)
    tok = Tokens(a.ds41, a.model)
    p, r = VISION["patch_size"], VISION["downsample_ratio"]
    g = -(-(vision_data.SIZE // p) // r)
    S = span_len((g, g))
    t0 = time.time()
    run_loss, run_acc, run_g, n_run = 0.0, 0.0, 0.0, 0

    def save():
        torch.save({"tower": tower.state_dict(), "opt": opt.state_dict(), "step": step, "log": log,
                    "vision": VISION, "image_token_id": IMAGE_TOKEN_ID}, path + ".tmp")
        os.replace(path + ".tmp", path)

    while step < a.steps and time.time() - t0 < a.minutes * 60:
        rng = random.Random("vision-train:%d:%d" % (a.seed, step))
        px, ids, tgt, words = batch(rng, tok, a.batch, S, lm.model.cfg["vocab_size"])
        lr = a.lr * min(1.0, (step + 1) / 50)
        for gr in opt.param_groups:
            gr["lr"] = lr
        span, grid = tower(px, want_grid=True)
        if a.ground_only:
            logits, loss = None, torch.zeros(())
        else:
            logits = lm.logits(span, ids, 2)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)
        total = loss
        if a.ground > 0:
            w = words.reshape(-1, words.shape[-1])
            has = w.sum(-1) > 0
            cos = F.normalize(grid.reshape(-1, grid.shape[-1]), dim=-1) @ F.normalize(lm.model.embed, dim=-1).t()
            lp = F.log_softmax(cos * 10.0, dim=-1)
            total = loss + a.ground * -(w[has] * lp[has]).sum(-1).mean()
        opt.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(tower.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            m = tgt >= 0
            ok = 0.0 if logits is None else ((logits.argmax(-1) == tgt) | ~m).all(-1).float().mean().item()
            g_loss = (total - loss).item()
        step += 1
        run_loss, run_acc, run_g, n_run = run_loss + loss.item(), run_acc + ok, run_g + g_loss, n_run + 1
        if step % 10 == 0:
            log.append({"step": step, "loss": run_loss / n_run, "acc": run_acc / n_run, "ground": run_g / n_run,
                        "seconds": round(time.time() - t0, 1)})
            print(json.dumps(log[-1]), flush=True)
            run_loss, run_acc, run_g, n_run = 0.0, 0.0, 0.0, 0
        if step % a.save_every == 0:
            save()
    save()
    print("stopped at step %d after %.0f s" % (step, time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
