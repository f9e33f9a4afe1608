#!/usr/bin/env -S /usr/bin/python3
"""Python side of tests/vision.test.sh (the reference of tools/reference/, exact mode).

  vision_ref.py pixels H W SEED OUT        random BF16 pixels [3, H, W] in [-1, 1] (raw LE BF16)
  vision_ref.py span CK PIXELS H W OUT     the image span (F32 [rows, dim]) of tools/reference/vision.py
  vision_ref.py logits CK PIXELS H W PRE POST N OUT [CHUNK]
                                           the logits rows vision_feed writes (same prompt: PRE text
                                           ids, the span, POST text ids, in chunks of CHUNK if given;
                                           N - 1 greedy decode steps)
  vision_ref.py cmp REF GOT [REL]          REL absent: bit for bit; else the fast-mode tolerance:
                                           max |diff| <= REL * max |REF| and RMS(diff) <= REL / 4 * RMS(REF)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "reference"))
from formats import bf16_round, bf16_from_bits, bf16_to_bits   # noqa: E402


def read_pixels(path, H, W):
    return bf16_from_bits(np.fromfile(path, dtype="<u2").reshape(3, H, W))


def main(a):
    if a[0] == "pixels":
        H, W, seed = int(a[1]), int(a[2]), int(a[3])
        px = bf16_round(np.random.default_rng(seed).uniform(-1, 1, (3, H, W)).astype(np.float32))
        bf16_to_bits(px).astype("<u2").tofile(a[4])
    elif a[0] == "span":
        from vision import Vision
        H, W = int(a[3]), int(a[4])
        Vision(a[1]).span(read_pixels(a[2], H, W)).astype("<f4").tofile(a[5])
    elif a[0] == "logits":
        from vision import Vision
        from model import Model, Sequence, forward, argmax_first
        H, W, pre, post, N = (int(x) for x in a[3:8])
        m = Model(a[1])
        span = Vision(a[1], m.ck).span(read_pixels(a[2], H, W))
        tok_id = int(__import__("json").load(open(os.path.join(a[1], "config.json"))).get("image_token_id", 129264))
        rows = span.shape[0]
        ids = [1 + 7 * i % 400 for i in range(pre)] + [tok_id] * rows + [3 + 11 * i % 400 for i in range(post)]
        mask = np.zeros(len(ids), dtype=bool)
        mask[pre:pre + rows] = True
        emb = np.zeros((len(ids), span.shape[1]), dtype=np.float32)
        emb[pre:pre + rows] = span
        seq = Sequence(m)
        chunk = int(a[9]) if len(a) > 9 else len(ids)
        for c0 in range(0, len(ids), chunk):
            c1 = min(len(ids), c0 + chunk)
            lg, _ = forward(m, seq, ids[c0:c1], image=(mask[c0:c1], emb[c0:c1]))
        out = [lg]
        for _ in range(1, N):
            lg, _ = forward(m, seq, [argmax_first(out[-1])])
            out.append(lg)
        np.stack(out).astype("<f4").tofile(a[8])
    elif a[0] == "cmp":
        r = np.fromfile(a[1], dtype="<f4")
        g = np.fromfile(a[2], dtype="<f4")
        if r.shape != g.shape:
            print("sizes differ: %d vs %d values" % (r.size, g.size))
            return 1
        d = np.abs(r.astype(np.float64) - g)
        if len(a) < 4:
            bad = int((r.view(np.uint32) != g.view(np.uint32)).sum())
            print("%d of %d values differ (max |diff| %g)" % (bad, r.size, d.max()))
            return 1 if bad else 0
        rel = float(a[3])
        mx, rms = d.max() / np.abs(r).max(), np.sqrt((d ** 2).mean() / (r.astype(np.float64) ** 2).mean())
        print("max |diff| / max |ref| %.3g, RMS ratio %.3g (limits %g, %g)" % (mx, rms, rel, rel / 4))
        return 0 if mx <= rel and rms <= rel / 4 else 1
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
