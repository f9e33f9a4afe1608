#!/usr/bin/env python3
"""Scores the demo model's answers about fresh generated scenes: 200 held-out images (a fixed
seed that training never draws: training seeds are strings "vision-train:..."), questions in
turn of colour, count and position (vision_data.py), greedy answers compared with the truth
(case, surrounding space and a final full stop ignored).

    python3 tools/train/vision_eval.py -m models/demo [--via lib|torch|cli] [--exact] [-n 200]

--via lib (default): ds41 itself: each PNG preprocessed by `ds41 image --dump-pixels` (decode,
resize plan, BF16 normalisation), then tests/tools/vision_ask (the library's ds41_image_span +
ds41_feed_embeds, greedy; --exact for the exact kernels). --via torch: the trainer's torch twin
on the weights the safetensors decode to (the language model with the release numerics
simulated, the tower in FP32 from the BF16 weights). The prompt is vision_train.layout's: the
chat template with the image span first in the user message. --via cli: the command a user
types, `ds41 run -m M --chat --image PNG -p QUESTION` (its rendering has a blank line after the
image span: vision_train.layout's gap, 70 % of the training prompts). Prints one JSON object (accuracy
overall and per kind); --details FILE writes every question, answer and verdict."""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vision_data  # noqa: E402
import vision_train as vt  # noqa: E402

SEED = 20261206
KINDS = ("colour", "count", "where")


def heldout(n):
    rng = random.Random(SEED)
    return [vision_data.sample(rng, KINDS[i % len(KINDS)]) for i in range(n)]


def norm(s):
    s = s.strip().lower()
    return s[:-1].strip() if s.endswith(".") else s


def answers_lib(a, items, tok, tmp):
    jobs = []
    for i, (im, kind, q, ans, _) in enumerate(items):
        png, px = os.path.join(tmp, "%03d.png" % i), os.path.join(tmp, "%03d.bf16" % i)
        im.save(png)
        out = subprocess.run([a.ds41, "image", "-m", a.model, "--json", "--dump-pixels", px, png],
                             stdout=subprocess.PIPE, check=True).stdout
        plan = json.loads(out)
        ids, at, first = vt.layout(tok, q, ans, plan["tokens"])
        pre = ids[:at]
        post = ids[at + plan["tokens"]:first]
        jobs.append("%s %d %d %s %s %d" % (px, plan["padded_height"], plan["padded_width"],
                                            ",".join(map(str, pre)), ",".join(map(str, post)), a.max_tokens))
    cmd = [a.ask, a.model] + (["--exact"] if a.exact else [])
    out = subprocess.run(cmd, input="\n".join(jobs) + "\n", stdout=subprocess.PIPE, check=True, text=True).stdout
    lines = out.split("\n")[:len(items)]
    return [decode(a, l) for l in lines]


def answers_cli(a, items, tmp):
    """What a user types: `ds41 run -m M --chat --image PNG -p QUESTION` (greedy, plain decoding),
    whose chat rendering puts a blank line after the image (layout's gap; --via lib asks without it)."""
    out = []
    for i, (im, kind, q, ans, _) in enumerate(items):
        png = os.path.join(tmp, "%03d.png" % i)
        im.save(png)
        cmd = [a.ds41, "run", "-m", a.model, "--chat", "--image", png, "-p", q, "-n", str(a.max_tokens),
               "--spec", "off"] + (["--exact"] if a.exact else [])
        txt = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True).stdout
        out.append(txt.decode("utf-8", "replace").split("<\uff5cend\u2581of\u2581sentence\uff5c>")[0])
    return out


def decode(a, ids):
    if not ids.strip():
        return ""
    return subprocess.run([a.ds41, "tokenize", "-m", a.model, "--decode", ids], stdout=subprocess.PIPE,
                          check=True).stdout.decode("utf-8", "replace")


def load_tower(model_dir):
    """vision_train.Tower holding the values of the exported BF16 tensors."""
    from checkpoint import open_tensors
    from vision_export import tower_names
    with open(os.path.join(model_dir, "config.json")) as f:
        doc = json.load(f)
    vc = doc["vision_config"]
    raw = open_tensors(model_dir)
    tower = vt.Tower(vc, doc["text_config"]["hidden_size"])
    sd = {}
    for key, name in tower_names(vc["num_hidden_layers"]).items():
        bits = np.asarray(raw[name].data).astype(np.uint32) << 16
        sd[key] = torch.from_numpy(bits.view(np.float32).copy()).reshape(tower.state_dict()[key].shape)
    tower.load_state_dict(sd)
    return tower


def answers_torch(a, items, tok):
    torch.set_num_threads(1)
    lm = vt.LM(a.model, sim=True)
    tower = load_tower(a.model)
    out = []
    with torch.no_grad():
        for im, kind, q, ans, _ in items:
            span = tower(vt.pixels(im)[None])
            ids, at, first = vt.layout(tok, q, ans, span.shape[1])
            ids = ids[:first]
            gen = []
            for _ in range(a.max_tokens):
                t = int(lm.logits(span, torch.tensor([ids]), at)[0, -1].argmax())
                if t == vt.EOS:
                    break
                gen.append(t)
                ids = ids + [t]
            out.append(decode(a, ",".join(map(str, gen))))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="models/demo")
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--via", choices=("lib", "torch", "cli"), default="lib")
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--ds41", default="build/ds41")
    ap.add_argument("--ask", default="build/tests/tools/vision_ask")
    ap.add_argument("--details", default=None)
    a = ap.parse_args()
    items = heldout(a.n)
    tok = vt.Tokens(a.ds41, a.model)
    if a.via in ("lib", "cli"):
        with tempfile.TemporaryDirectory(prefix="ds41-veval.") as tmp:
            got = answers_lib(a, items, tok, tmp) if a.via == "lib" else answers_cli(a, items, tmp)
    else:
        got = answers_torch(a, items, tok)
    per = {}
    rows = []
    for (im, kind, q, ans, _), g in zip(items, got):
        ok = norm(g) == norm(ans)
        per.setdefault(kind, [0, 0])
        per[kind][0] += ok
        per[kind][1] += 1
        rows.append({"kind": kind, "question": q, "answer": ans, "got": g, "ok": ok})
    right = sum(r["ok"] for r in rows)
    res = {"via": a.via, "exact": a.exact, "n": len(rows), "correct": right, "accuracy": right / len(rows),
           "per_kind": {k: {"correct": c, "n": n, "accuracy": c / n} for k, (c, n) in per.items()}}
    if a.details:
        with open(a.details, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
