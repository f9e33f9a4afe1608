#!/usr/bin/env -S /usr/bin/python3
"""Greedy generation with the Python reference, writing the trace directory of docs/conformance.md.

usage: ref.py -m DIR --prompt-ids 1,2,3 -n N [--chunk C] [--index-k own|official]
              [--prefill full|ced-replay] [--trace OUTDIR] [--dump-logits FILE]

Run: the prompt is processed in one forward at start 0 (or, with --chunk C, in chunks of C
tokens: the first at start 0, the rest as extend forwards; a chunk of one token at P > 0 is a
decode step). Logits row 0 is the last prompt row's; token 0 = its argmax. Then N-1 decode steps:
step i (i = 1..N-1) feeds token i-1 at position P = n_prompt + i - 1 and yields logits row i and
token i; with DSpark, each decode step is followed by one proposal (5.2) from main_hidden[P] and
token i. The last generated token is not fed back. N >= 1.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from model import Model, Sequence, Trace, forward, argmax_first   # noqa: E402
from checkpoint import CheckpointError                            # noqa: E402
import dspark                                                     # noqa: E402


def prompt_forward(model, seq, prompt, chunk, trace, replay=False):
    """Prompt forwards; seeds the DSpark rings (for the rows the target layers ran on). Returns
    the last row's logits."""
    chunk = chunk or len(prompt)
    logits = None
    for c0 in range(0, len(prompt), chunk):
        logits, mh = forward(model, seq, prompt[c0:c0 + chunk], trace, replay=replay)
        if model.has_dspark:
            dspark.seed_rings(model, seq, mh, seq.pos - mh.shape[0])
    return logits


def generate(model, prompt, n, chunk=0, trace=None, replay=False):
    """Greedy run. Returns (generated ids, logits rows [n, vocab], proposals [(ids, conf)], seq)."""
    seq = Sequence(model)
    logits = prompt_forward(model, seq, prompt, chunk, trace, replay)
    rows, out, props = [logits], [argmax_first(logits)], []
    for _ in range(1, n):
        P = seq.pos
        logits, mh = forward(model, seq, [out[-1]], trace)
        rows.append(logits)
        out.append(argmax_first(logits))
        if model.has_dspark:
            props.append(dspark.propose(model, seq, P, mh[0], out[-1]))
    return out, np.stack(rows).astype(np.float32), props, seq


def write_trace(outdir, model, prompt, out, rows, props, seq, trace):
    os.makedirs(outdir, exist_ok=True)

    def w(name, arr, dt):
        np.ascontiguousarray(arr, dtype=dt).tofile(os.path.join(outdir, name))

    cfg = model.cfg
    w("tokens.i32", list(prompt) + list(out), "<i4")
    w("logits.f32", rows, "<f4")
    for l, parts in trace.topk.items():
        w("topk_L%d.i32" % l, np.concatenate(parts), "<i4")
    for l, parts in trace.experts.items():
        w("experts_L%d.i32" % l, np.concatenate(parts), "<i4")
    for l in seq.main:
        w("kv_L%d.bin" % l, seq.main[l].records(), np.uint8)
        w("ik_L%d.bin" % l, seq.ik[l].records(), np.uint8)
    for p in model.plan[:cfg["n_layers"]]:
        w("swa_L%d.bin" % p.id, seq.rings[p.id].records(), np.uint8)
    for l, st in seq.comp.items():
        w("comp_L%d.f32" % l, np.concatenate([st.kv.reshape(-1), st.score.reshape(-1)]), "<f4")
    if props:
        w("dspark.i32", np.concatenate([p[0] for p in props]), "<i4")
        w("dspark.f32", np.concatenate([p[1] for p in props]), "<f4")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("-n", "--n-predict", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=0)
    ap.add_argument("--index-k", choices=("own", "official"), default="own")
    ap.add_argument("--prefill", choices=("full", "ced-replay"), default="full",
                    help="full (default; exact) or ced-replay (spec 4.1 approximation)")
    ap.add_argument("--trace")
    ap.add_argument("--dump-logits")
    a = ap.parse_args(argv)
    try:
        prompt = [int(t) for t in a.prompt_ids.split(",") if t.strip() != ""]
    except ValueError:
        ap.error("--prompt-ids: expected comma-separated integers")
    if not prompt:
        ap.error("--prompt-ids: empty prompt")
    if a.n_predict < 1:
        ap.error("-n must be >= 1")
    if a.chunk < 0:
        ap.error("--chunk must be >= 0")
    if a.prefill == "ced-replay" and a.chunk:
        ap.error("--prefill ced-replay is a one-shot prefill; it does not take --chunk")
    try:
        model = Model(a.model, index_k=a.index_k)
    except CheckpointError as e:
        print("ref.py: %s" % e, file=sys.stderr)
        return 1
    V = model.cfg["vocab_size"]
    bad = [t for t in prompt if not 0 <= t < V]
    if bad:
        print("ref.py: prompt id %d outside the vocabulary [0, %d)" % (bad[0], V), file=sys.stderr)
        return 1
    trace = Trace() if a.trace else None
    t0 = time.time()
    out, rows, props, seq = generate(model, prompt, a.n_predict, a.chunk, trace, a.prefill == "ced-replay")
    dt = time.time() - t0
    if a.trace:
        write_trace(a.trace, model, prompt, out, rows, props, seq, trace)
    if a.dump_logits:
        rows.astype("<f4").tofile(a.dump_logits)
    print(",".join(str(t) for t in out))
    print("ref.py: %d prompt + %d generated tokens in %.2f s" % (len(prompt), len(out), dt), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
