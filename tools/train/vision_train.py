#!/usr/bin/env python3
"""Trains the demo model's vision tower (docs/vision.md: patch 14, 2D rotary ViT, 3 x 3
unshuffle, two-layer aligner to width 192, image start / end / newline vectors) on generated
scenes (vision_data.py), with the language model frozen at its released weights (every text
weight of models/demo stays bit for bit as it is) or, with --train-lm, trained with it.

    nice -n 19 python3 tools/train/vision_train.py --minutes 40     # resumable: a rerun continues
    python3 tools/train/vision_train.py --train-lm all --text-mix 2 --steps 3000 --minutes 60

The prompt is the chat template with the image span first in the user message:

    <BOS><User> [start, (tok tok tok, newline) x 3, end] QUESTION <Assistant></think> ANSWER <EOS>

every span position carrying image_token_id; the loss is the cross-entropy of ANSWER and EOS,
plus (--ground) a grounding term: each cell's aligned token, read through the (detached) embedding
matrix as a classifier (cosine similarity x 10, so that it steers directions, not norms), predicts
the tokens of the colour, shape and position words of the shape drawn in that cell (the model
copies words from the user message well: its chat data answers "What does WORD mean?" starting
with WORD, so image tokens that look like the words are easy for it to use).
The language model runs as ds41 runs it for an image (docs/vision.md "Image span"): the span's
embeddings replace the token embeddings, its Engram gate is 0 and it is dead in the n-gram
history. The routers' bias_vl is exported equal to bias (selection is not differentiable and the
experts were balanced on text; the balancing is not run here), so the routing needs nothing here.

--train-lm PARTS (all, or some of attn, ffn, mhc, norm, engram, embed, head) unfreezes those
parts of the backbone (the DSpark stages stay; train.py --init-release retrains them on the
result). They train in the release formats (v41 `wq`: fake-quantized FP8 / FP4 / BF16 / E4M3 with
straight-through gradients, as train.py's QAT phase), starting from the values the committed file
decodes to (fixed points of the quantizers, so step 0 computes what ds41 computes), with Adam at
--lm-lr, and --text-mix windows of build/demo-data text per step (train.py's language-model
loss) so that the text figures hold; the held-out text loss (train.py's fixed windows) is logged
at the evaluations. vision_export.py then writes the changed tensors.

The tower runs in FP32 (ds41 runs the exported BF16 weights); the language model runs with the
release numerics simulated (v41.Ctx sim: the BF16 roundings and Q8 activations ds41 computes).
Every --eval-every steps, the held-out scenes of vision_eval.py are scored teacher-forced: the
answer loss per kind and the share answered exactly (equal to greedy decoding's in the twin).
Checkpoints (OUT/vision_state.pt: the tower, the trained language-model parameters, Adam, the
step, the log, and the sha256 of the model.safetensors trained on) every --save-every steps and
at the end; --minutes stops the sitting (status 3 when --steps is not reached yet)."""

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

def lm_forward(model, tokens, span, span_at, eng_ids, c, rows=None):
    """V41.forward with the span's embeddings at positions span_at .. span_at + S - 1 and their
    Engram gates 0 (docs/vision.md). tokens [B, T]; span [B, S, dim]. -> logits [B, T, V], or with
    rows (bool [B, T]) the logits of those positions only [N, V] (the head is a fifth of the work)."""
    cfg = model.cfg
    B, T = tokens.shape
    S = span.shape[1]
    hc = cfg["hc_mult"]
    table = v41.ste(model.embed, v41.bf16(model.embed)) if c.wq else model.embed
    emb = table[tokens]
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
    if rows is not None:
        h = h[rows]
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


def layout(tok, question, answer, S, gap=False):
    """-> (ids, span_at, first answer position): BOS User span question Assistant </think> answer EOS;
    gap: a blank line between the span and the question, as `ds41 run --chat` and `ds41 chat`'s
    /image render an attached image"""
    head = [BOS, USER] + [IMAGE_TOKEN_ID] * S + tok(("\n\n" + question) if gap else question) + [ASSISTANT, END_THINK]
    return head + tok(answer) + [EOS], 2, len(head)


GROUND_COUNT = False     # --ground-count
GAP_EVAL = False         # --gap-share > 0: the held-out answers are asked in the gap layout


def cell_words(tok, objs, V):
    """The grounding target of each 3 x 3 cell [9, V]: equal weights on the tokens of the colour,
    the shape and the position words of the shape drawn there (as the answers spell them), and
    with --ground-count the number of shapes of its kind in the image ("2": the tower sees the
    whole image, so a cell can carry its kind's count and "How many squares are there?" becomes
    a look-up like the colour's); empty cells get none (all zero)."""
    t = torch.zeros(9, V)
    for shape, colour, cell, *_ in objs:
        ids = tok(colour) + tok(shape) + tok(vision_data.CELLS[cell])
        if GROUND_COUNT:
            ids = ids + tok(str(sum(1 for o in objs if o[0] == shape)))
        for i in ids:
            t[cell, i] += 1.0 / len(ids)
    return t


def ground_acc(cos, w, tok):
    """Share of the drawn cells whose aligned token is nearest (mean cosine over a word's tokens) to
    its own colour among the five and to its own shape among the three: [colour, shape]."""
    out = []
    for words in (sorted(vision_data.COLOURS), vision_data.SHAPES):
        ids = [tok(x) for x in words]
        score = torch.stack([cos[:, i].mean(-1) for i in ids], -1)          # [cells, words]
        truth = torch.stack([(w[:, i] > 0).all(-1) for i in ids], -1)
        has = truth.any(-1)
        out.append((truth[has].gather(1, score[has].argmax(-1, keepdim=True))).float().mean().item())
    return out


def answer_text(answer, space):
    """The answer as trained: --answer-space puts a space before it (' red' is one token of the demo
    vocabulary, 'red' at the start of a text is another; ' top left' is 2 tokens, 'top left' 3)."""
    return (" " + answer) if space else answer


def encode(rng_items, tok, S, V, space, gaps=None):
    """[(PIL image, kind, question, answer, objects)] -> pixels, ids, targets, grounding words, kinds."""
    ims, seqs, words, kinds = [], [], [], []
    for j, (im, kind, q, a, objs) in enumerate(rng_items):
        ids, at, first = layout(tok, q, answer_text(a, space), S, bool(gaps[j]) if gaps else GAP_EVAL)
        ims.append(pixels(im))
        seqs.append((ids, first))
        words.append(cell_words(tok, objs, V))
        kinds.append(kind)
    T = max(len(s) for s, _ in seqs)
    ids = torch.full((len(seqs), T), EOS, dtype=torch.long)
    tgt = torch.full((len(seqs), T), -100, dtype=torch.long)
    for b, (sq, first) in enumerate(seqs):
        ids[b, :len(sq)] = torch.tensor(sq)
        tgt[b, first - 1:len(sq) - 1] = torch.tensor(sq[first:])
    return torch.stack(ims), ids, tgt, torch.stack(words), kinds


def batch(rng, tok, n, S, V, n_max=4, space=False, count_share=0.0, gap_share=0.0):
    """n training scenes; count_share > 0: that share of them asks a count question (the rest as
    vision_data.sample draws them); gap_share > 0: that share has the blank line of layout()'s gap."""
    kinds = [("count" if count_share > 0 and rng.random() < count_share else None) for _ in range(n)]
    gaps = [gap_share > 0 and rng.random() < gap_share for _ in range(n)] if gap_share > 0 else None
    return encode([vision_data.sample(rng, kind=k, n_max=n_max) for k in kinds], tok, S, V, space, gaps)


# the parts of the language model --train-lm can unfreeze (backbone only: the DSpark stages stay
# as released; `train.py --init-release` retrains them on the changed backbone)
LM_PARTS = ("attn", "ffn", "mhc", "norm", "engram", "embed", "head")


def lm_part(name, nL):
    """The LM_PARTS group of a backbone parameter name; None for the DSpark stages."""
    top = name.split(".")[0]
    if top == "embed":
        return "embed"
    if top == "head":
        return "head"
    if top == "norm":
        return "norm"
    if top == "engrams":
        return "engram"
    if top == "blocks":
        f = name.split(".")
        if int(f[1]) >= nL:
            return None
        if f[2] == "attn":
            return "attn"
        if f[2] == "ffn":
            return "ffn"
        if f[2] in ("hc_attn", "hc_ffn"):
            return "mhc"
        if f[2] in ("attn_norm", "ffn_norm"):
            return "norm"
    return None


def parse_parts(spec):
    """'' -> frozen; 'all' -> every LM_PARTS group; else a comma-separated subset."""
    if not spec or spec == "none":
        return ()
    parts = LM_PARTS if spec == "all" else tuple(x.strip() for x in spec.split(","))
    bad = [x for x in parts if x not in LM_PARTS]
    if bad:
        raise SystemExit("vision_train: --train-lm: unknown part %s (known: all, none, %s)" % (bad[0], ", ".join(LM_PARTS)))
    return parts


def file_sha256(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for blk in iter(lambda: f.read(1 << 20), b""):
            h.update(blk)
    return h.hexdigest()


class LM:
    """The demo language model and what its forward needs: frozen at its released weights, or
    with the parts in `parts` trainable (then its weights are fake-quantized in the release formats,
    as train.py's QAT phase does, so that the exported file computes what was trained; on the
    released values, which are fixed points of the quantizers, that forward is the frozen one)."""

    def __init__(self, model_dir, sim=True, parts=()):
        with open(os.path.join(model_dir, "config.json")) as f:
            doc = json.load(f)
        self.model = v41.V41(doc)
        self.model.load_state_dict(load_release(self.model, model_dir))
        self.model.eval()
        self.parts = tuple(parts)
        self.trainable = {}
        for name, prm in self.model.named_parameters():
            on = lm_part(name, self.model.nL) in self.parts
            prm.requires_grad_(on)
            if on:
                self.trainable[name] = prm
        tm = np.fromfile(os.path.join(model_dir, "engram_token_map.i32"), dtype="<i4").astype(np.int64)
        self.token_map = tm
        self.pad = int(tm[self.model.cfg["engram_pad_id"]])
        self.tmap = np.concatenate([tm, [-1]])       # the extra id: a dead history entry
        self.dead = len(tm)
        self.c = v41.Ctx(sim=sim, wq=bool(self.parts), sparse=True)

    def logits(self, span, ids, span_at, rows=None):
        x = ids.numpy().copy()
        x[:, span_at:span_at + span.shape[1]] = self.dead
        eng = torch.from_numpy(v41.engram_ids(self.model.engram_consts, self.tmap, x, self.pad))
        return lm_forward(self.model, ids, span, span_at, eng, self.c, rows)


def answer_loss(lm, span, ids, tgt):
    """-> per answer token cross-entropy [N], sequence of each token [N], whether each sequence's
    every answer token (EOS included) is the argmax [B]: greedy decoding's answer, teacher-forced."""
    rows = tgt >= 0
    lg = lm.logits(span, ids, 2, rows)
    t = tgt[rows]
    ce = F.cross_entropy(lg, t, reduction="none")
    seq = rows.nonzero()[:, 0]
    wrong = torch.zeros(tgt.shape[0]).index_add_(0, seq, (lg.argmax(-1) != t).float())
    return ce, seq, wrong == 0


def span_len(S_grid):
    gh, gw = S_grid
    return gh * (gw + 1) + 2


class Text:
    """Text windows of build/demo-data (train.py's files) for mixing into the steps, and the held-out
    loss as train.py measures it (fixed, evenly spaced windows of 256 tokens from BOS)."""

    def __init__(self, data_dir, model_dir, ctx):
        import train
        for f in ("train.bin", "heldout.bin"):
            if not os.path.exists(os.path.join(data_dir, f)):
                raise SystemExit("vision_train: %s/%s is missing (text mixing and the held-out text loss need it): "
                                 "python3 tools/train/corpus.py build && python3 tools/train/corpus.py tokenize"
                                 % (data_dir, f))
        self.train_mod = train
        self.data = train.Data(data_dir, model_dir, 256, 8, 0)
        self.ctx = ctx

    def batch(self, seed, step, n):
        rng = np.random.default_rng([seed, step, 7])
        off = rng.integers(0, len(self.data.train) - self.ctx - 2, size=n)
        return np.stack([self.data.train[o:o + self.ctx + 1] for o in off]).copy()

    def loss(self, lm, w):
        w = w.copy()
        w[:, 0] = BOS
        return self.train_mod.lm_loss(lm.model, self.data, w, lm.c)[0]

    def heldout(self, lm, n):
        c = v41.Ctx(sim=lm.c.sim, wq=True, sparse=True)     # the release formats (as trained for QAT)
        return self.train_mod.evaluate(lm.model, self.data, c, n=n)


@torch.no_grad()
def heldout_answers(lm, tower, tok, items, S, space, chunk=20):
    """Teacher-forced on the held-out scenes: per kind, the answer loss (nats per answer token,
    EOS included) and the share whose every answer token and EOS is the argmax, which is exactly
    the share greedy decoding answers correctly (in the torch twin)."""
    per = {}
    for i in range(0, len(items), chunk):
        px, ids, tgt, _, kinds = encode(items[i:i + chunk], tok, S, lm.model.cfg["vocab_size"], space)
        ce, seq, ok = answer_loss(lm, tower(px), ids, tgt)
        for b, k in enumerate(kinds):
            r = per.setdefault(k, [0.0, 0, 0, 0])
            r[0] += ce[seq == b].sum().item()
            r[1] += int((seq == b).sum())
            r[2] += int(ok[b])
            r[3] += 1
    out = {k: {"loss": round(r[0] / r[1], 4), "correct": r[2], "n": r[3]} for k, r in sorted(per.items())}
    out["accuracy"] = round(sum(r[2] for r in per.values()) / max(1, sum(r[3] for r in per.values())), 4)
    return out


def lr_factor(step, last, decay_from=-1, final=0.1):
    """The rates' factor at a step: a linear warm-up over the first 50 steps, then 1; with decay_from >= 0,
    a cosine from 1 at decay_from to `final` at `last` (a function of the step alone, so a resumed run
    continues the same schedule)."""
    f = min(1.0, (step + 1) / 50)
    if 0 <= decay_from < last and step >= decay_from:
        t = min(1.0, (step - decay_from) / (last - decay_from))
        f *= final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * t))
    return f


def load_tower(src):
    """--init-tower: {"tower": state dict, "vision": config, "step": int} from a vision_state.pt, or from a
    released model directory's config.json (vision_config) and model.safetensors (the BF16 tower tensors,
    read back under vision_export.tower_names' keys)."""
    if not os.path.isdir(src):
        return torch.load(src)
    import vision_export
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    vc = cfg.get("vision_config")
    if not vc:
        raise SystemExit("vision_train: %s/config.json has no vision_config: that model has no tower to start from" % src)
    vc = {k: v for k, v in vc.items() if k in VISION}
    raw = vision_export.read_raw(os.path.join(src, "model.safetensors"))
    tower = {}
    for key, name in vision_export.tower_names(vc["num_hidden_layers"]).items():
        if name not in raw:
            raise SystemExit("vision_train: %s/model.safetensors lacks %s" % (src, name))
        dtype, shape, data = raw[name]
        if dtype != "BF16":
            raise SystemExit("vision_train: %s/model.safetensors has %s as %s; the tower is exported in BF16" % (src, name, dtype))
        bits = np.frombuffer(data.tobytes(), dtype=np.uint16).astype(np.uint32) << 16
        tower[key] = torch.from_numpy(bits.view(np.float32).reshape(shape).copy())
    return {"tower": tower, "vision": vc, "step": 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="models/demo")
    ap.add_argument("--out", default="build/demo-vision")
    ap.add_argument("--ds41", default="build/ds41")
    ap.add_argument("--minutes", type=float, default=40.0,
                    help="stop after this much wall time (this run): save and exit with status 3 when --steps is "
                         "not reached yet (a rerun continues)")
    ap.add_argument("--steps", type=int, default=100000, help="the run's last step (status 0 when reached)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3, help="the tower's learning rate")
    ap.add_argument("--save-every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-sim", action="store_true", help="run the language model in plain FP32")
    ap.add_argument("--ground", type=float, default=0.3,
                    help="weight of the grounding loss: each cell's aligned token, read through the frozen "
                         "embedding matrix as a classifier (cosine similarity x 10, so that it steers directions, not norms), predicts the words of the shape drawn there")
    ap.add_argument("--ground-only", action="store_true",
                    help="train the grounding term alone (no language-model pass: fast); a pre-phase")
    ap.add_argument("--train-lm", default="",
                    help="unfreeze these parts of the language model: 'all' or a comma-separated subset of "
                         + ", ".join(LM_PARTS) + " (default: frozen). They train in the release formats "
                         "(fake-quantized, as QAT); vision_export.py writes the changed tensors")
    ap.add_argument("--lm-lr", type=float, default=1e-3, help="learning rate of the unfrozen language-model parts")
    ap.add_argument("--text-data", default="build/demo-data", help="train.py's token files (text mixing, held-out loss)")
    ap.add_argument("--text-mix", type=int, default=None,
                    help="text windows per step, trained on with the answers so the text figures hold "
                         "(default 2 with --train-lm, else 0)")
    ap.add_argument("--text-ctx", type=int, default=128, help="tokens per mixed text window")
    ap.add_argument("--text-weight", type=float, default=1.0, help="weight of the text loss")
    ap.add_argument("--width", type=int, default=VISION["hidden_size"],
                    help="the tower's width (4 heads, MLP 2 x width); a fresh run only")
    ap.add_argument("--curriculum", type=int, default=0,
                    help="scenes of at most 1 + 3 step / N shapes for the first N steps (then 1-4)")
    ap.add_argument("--answer-space", action="store_true", help="train answers with a leading space (' red')")
    ap.add_argument("--eval-every", type=int, default=50, help="held-out answers every N steps (0: never)")
    ap.add_argument("--eval-n", type=int, default=60, help="held-out scenes for that (vision_eval.py's, in turn by kind)")
    ap.add_argument("--text-eval-n", type=int, default=16,
                    help="held-out text windows of 256 for the text loss at the start and every --eval-every "
                         "(with --train-lm; 0: never)")
    ap.add_argument("--ground-count", action="store_true",
                    help="the grounding target of a drawn cell also holds its kind's count in the image")
    ap.add_argument("--count-share", type=float, default=0.0,
                    help="share of the training scenes asked a count question (0: vision_data's mix, "
                         "about 30 %%); the held-out scenes are unchanged")
    ap.add_argument("--gap-share", type=float, default=0.0,
                    help="share of the training scenes asked with a blank line between the image and the question, "
                         "as ds41 run --chat and ds41 chat render them (held-out answers are then asked so)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the run's figures were measured so)")
    ap.add_argument("--init-tower", default="",
                    help="a fresh run's tower (weights and shape) from another run's vision_state.pt, such as a "
                         "--ground-only pre-phase on an earlier text model, or from a released model directory "
                         "that has one (its BF16 tower, as ds41 runs it: a continuation of that model's run)")
    ap.add_argument("--decay-from", type=int, default=-1,
                    help="from this step to --steps, both learning rates fall on a cosine from their values to "
                         "--lr-final of them (default: no decay, constant after the 50-step warm-up)")
    ap.add_argument("--lr-final", type=float, default=0.1, help="the share of the rates left at --steps (with --decay-from)")
    ap.add_argument("--text-eval-every", type=int, default=0,
                    help="the held-out text loss only at evaluations on multiples of N steps and at the last "
                         "step (default: at every evaluation)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    global GROUND_COUNT, GAP_EVAL
    GROUND_COUNT = a.ground_count
    GAP_EVAL = a.gap_share > 0
    torch.set_flush_denormal(True)
    os.makedirs(a.out, exist_ok=True)
    parts = parse_parts(a.train_lm)
    path = os.path.join(a.out, "vision_state.pt")
    st = torch.load(path) if os.path.exists(path) else None
    base_sha = file_sha256(os.path.join(a.model, "model.safetensors"))
    settings = {"train_lm": list(parts), "answer_space": a.answer_space}
    if st is not None:
        old = {"train_lm": list(st.get("train_lm", [])), "answer_space": st.get("answer_space", False)}
        if old != settings:
            raise SystemExit("vision_train: %s was trained with %s, this run asks for %s: rerun with the same "
                             "settings, or remove it to start over" % (path, old, settings))
        if st.get("base_sha256", base_sha) != base_sha:
            raise SystemExit("vision_train: %s was trained on a %s/model.safetensors of sha256 %s; it now has %s: "
                             "remove the state to start over on the new model" % (path, a.model, st["base_sha256"], base_sha))
    init = load_tower(a.init_tower) if (st is None and a.init_tower) else None
    vc = dict(st["vision"]) if st is not None else (dict(init["vision"]) if init is not None else
                                                    dict(VISION, hidden_size=a.width, intermediate_size=2 * a.width))
    lm = LM(a.model, sim=not a.no_sim, parts=parts)
    dim = lm.model.cfg["dim"]
    V = lm.model.cfg["vocab_size"]
    torch.manual_seed(a.seed)
    tower = Tower(vc, dim)
    with torch.no_grad():                         # delimiters start at the text embeddings' scale
        rms = lm.model.embed.pow(2).mean().sqrt()
        for v in (tower.image_start, tower.image_end, tower.image_newline):
            v.mul_(rms)
    if init is not None:
        tower.load_state_dict(init["tower"])
        print("tower from %s (its step %d)" % (a.init_tower, init["step"]), flush=True)
    init = None
    groups_ = [{"params": list(tower.parameters()), "lr": a.lr}]
    if parts:
        groups_.append({"params": list(lm.trainable.values()), "lr": a.lm_lr})
    opt = torch.optim.Adam(groups_, lr=a.lr)
    step, log = 0, []
    if st is not None:
        tower.load_state_dict(st["tower"])
        if parts:
            with torch.no_grad():
                for name, v in st["lm"].items():
                    lm.trainable[name].copy_(v)
        opt.load_state_dict(st["opt"])
        step, log = st["step"], st["log"]
        print("resumed at step %d" % step, flush=True)
    st = None
    text_mix = a.text_mix if a.text_mix is not None else (2 if parts else 0)
    text = None
    if text_mix > 0 or (parts and a.text_eval_n > 0):
        text = Text(a.text_data, a.model, a.text_ctx)
    tok = Tokens(a.ds41, a.model)
    p, r = vc["patch_size"], vc["downsample_ratio"]
    g = -(-(vision_data.SIZE // p) // r)
    S = span_len((g, g))
    items = None
    if a.eval_every > 0:
        import vision_eval
        items = vision_eval.heldout(a.eval_n)
    t0 = time.time()
    run = {"loss": 0.0, "acc": 0.0, "ground": 0.0, "text": 0.0, "n": 0, "kind": {}}

    def save():
        torch.save({"tower": tower.state_dict(), "opt": opt.state_dict(), "step": step, "log": log,
                    "vision": vc, "image_token_id": IMAGE_TOKEN_ID, "base_sha256": base_sha,
                    "lm": {n: prm.detach().clone() for n, prm in lm.trainable.items()}, **settings}, path + ".tmp")
        os.replace(path + ".tmp", path)

    def evaluate(force_text=False):
        rec = {"step": step, "eval": heldout_answers(lm, tower, tok, items, S, a.answer_space) if items else None,
               "seconds": round(time.time() - t0, 1)}
        te = a.text_eval_every or a.eval_every or 1
        if text is not None and parts and a.text_eval_n > 0 and (step % te == 0 or step >= a.steps):
            rec["text_heldout"] = round(text.heldout(lm, a.text_eval_n), 4)
        rec["eval_seconds"] = round(time.time() - t0 - rec["seconds"], 1)
        log.append(rec)
        print(json.dumps(rec), flush=True)

    step0 = step
    if step == 0 and (items or (parts and text is not None and a.text_eval_n > 0)):
        evaluate()
    while step < a.steps and time.time() - t0 < a.minutes * 60:
        rng = random.Random("vision-train:%d:%d" % (a.seed, step))
        n_max = min(4, 1 + (3 * step) // a.curriculum) if a.curriculum > 0 and step < a.curriculum else 4
        px, ids, tgt, words, kinds = batch(rng, tok, a.batch, S, V, n_max, a.answer_space, a.count_share, a.gap_share)
        lr = lr_factor(step, a.steps, a.decay_from, a.lr_final)
        opt.param_groups[0]["lr"] = a.lr * lr
        if parts:
            opt.param_groups[1]["lr"] = a.lm_lr * lr
        span, grid = tower(px, want_grid=True)
        if a.ground_only:
            loss, ce = torch.zeros(()), None
        else:
            ce, seq, seq_ok = answer_loss(lm, span, ids, tgt)
            loss = ce.mean()
        total = loss
        if a.ground > 0:
            w = words.reshape(-1, words.shape[-1])
            has = w.sum(-1) > 0
            emb = lm.model.embed.detach()
            cos = F.normalize(grid.reshape(-1, grid.shape[-1]), dim=-1) @ F.normalize(emb, dim=-1).t()
            lp = F.log_softmax(cos * 10.0, dim=-1)
            total = total + a.ground * -(w[has] * lp[has]).sum(-1).mean()
            with torch.no_grad():
                ga = ground_acc(cos.detach(), w, tok)
                run["gacc"] = [x + y for x, y in zip(run.get("gacc", [0.0, 0.0]), ga)]
        tl = torch.zeros(())
        if text_mix > 0:
            tl = text.loss(lm, text.batch(a.seed, step, text_mix))
            total = total + a.text_weight * tl
        opt.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(tower.parameters(), 1.0)
        if parts:
            torch.nn.utils.clip_grad_norm_(list(lm.trainable.values()), 1.0)
        opt.step()
        with torch.no_grad():
            ok = 0.0 if ce is None else seq_ok.float().mean().item()
            g_loss = (total - loss - a.text_weight * tl).item()
            if ce is not None:
                for b, k in enumerate(kinds):
                    kr = run["kind"].setdefault(k, [0.0, 0])
                    kr[0] += ce[seq == b].sum().item()
                    kr[1] += int((seq == b).sum())
        step += 1
        run["loss"] += loss.item()
        run["acc"] += ok
        run["ground"] += g_loss
        run["text"] += tl.item()
        run["n"] += 1
        if step % 10 == 0:
            n = run["n"]
            rec = {"step": step, "loss": round(run["loss"] / n, 4), "acc": round(run["acc"] / n, 4),
                   "ground": round(run["ground"] / n, 4),
                   "ground_acc": [round(x / n, 3) for x in run.get("gacc", [0.0, 0.0])],
                   "kind_loss": {k: round(v[0] / v[1], 4) for k, v in sorted(run["kind"].items())},
                   "seconds": round(time.time() - t0, 1)}
            if text_mix > 0:
                rec["text"] = round(run["text"] / n, 4)
            log.append(rec)
            print(json.dumps(rec), flush=True)
            run = {"loss": 0.0, "acc": 0.0, "ground": 0.0, "text": 0.0, "n": 0, "kind": {}}
        if a.eval_every > 0 and (step % a.eval_every == 0 or step == a.steps):
            evaluate()
        if step % a.save_every == 0:
            save()
    if step > step0 or not os.path.exists(path):     # a finished run rerun leaves its state (and its date) as is
        save()
    print("stopped at step %d after %.0f s" % (step, time.time() - t0), flush=True)
    if step < a.steps:
        sys.exit(3)


if __name__ == "__main__":
    main()
