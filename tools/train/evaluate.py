#!/usr/bin/env python3
"""Perplexity of the torch twin on a text file, in exactly the windows `ds41 perplexity` scores
(llama.cpp's convention: the file tokenized once by ds41 with special-token text as plain text,
non-overlapping windows of --ctx tokens starting with BOS, the second half of each scored).

    python3 tools/train/evaluate.py --weights build/demo-train/released.pt -m models/demo \
        -f build/demo-data/heldout.txt --ctx 256 [--max-windows N] [--mode sim|fp32]

--mode sim (default) runs the twin with the release numerics simulated (BF16 roundings, Q8
activations, FP8 SWA / FP4 KV and index-K records), which is what ds41 computes; fp32 runs it
without them. Prints one JSON object: perplexity, nll per token, bits per byte, tokens, windows."""

import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import v41  # noqa: E402


def tokenize(ds41, model_dir, path):
    with open(path, "rb") as f:
        text = f.read()
    out = subprocess.run([ds41, "tokenize", "-m", model_dir, "--no-special", "-"], input=text,
                         stdout=subprocess.PIPE, check=True).stdout
    return np.array([int(x) for x in out.split()], dtype=np.int64)


def detok_bytes(ds41, model_dir, ids):
    out = subprocess.run([ds41, "tokenize", "-m", model_dir, "--decode", ",".join(str(int(i)) for i in ids)],
                         stdout=subprocess.PIPE, check=True).stdout
    return len(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", default=None,
                    help="a torch state dict (export.py's released.pt); default: decode -m DIR's safetensors")
    ap.add_argument("-m", "--model", default="models/demo")
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--max-windows", type=int, default=0)
    ap.add_argument("--mode", choices=("sim", "fp32"), default="sim")
    ap.add_argument("--ds41", default=os.path.join(HERE, "..", "..", "ds41"))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    with open(os.path.join(args.model, "config.json")) as f:
        model = v41.V41(json.load(f))
    if args.weights:
        model.load_state_dict(torch.load(args.weights))
    else:
        from export import load_release
        model.load_state_dict(load_release(model, args.model))
    model.eval()
    token_map = np.fromfile(os.path.join(args.model, "engram_token_map.i32"), dtype="<i4").astype(np.int64)
    pad = int(token_map[model.cfg["engram_pad_id"]])
    ids = tokenize(args.ds41, args.model, args.file)
    C = args.ctx
    first = C // 2
    n_win = len(ids) // C
    if args.max_windows:
        n_win = min(n_win, args.max_windows)
    c = v41.Ctx(sim=(args.mode == "sim"), wq=False, sparse=True)
    nll, scored, nbytes = 0.0, 0, 0
    with torch.no_grad():
        for w in range(n_win):
            win = ids[w * C:(w + 1) * C].copy()
            win[0] = 0
            x = win[None, :]
            eng = None
            if model.engram_consts is not None:
                eng = torch.from_numpy(v41.engram_ids(model.engram_consts, token_map, x, pad))
            logits, _, _ = model(torch.from_numpy(x), eng, c)
            lp = F.log_softmax(logits[0].double(), dim=-1)
            tgt = torch.from_numpy(win[first + 1:])
            nll -= lp[first:C - 1].gather(1, tgt[:, None]).sum().item()
            scored += C - 1 - first
            nbytes += detok_bytes(args.ds41, args.model, win[first + 1:])
    res = {"file": args.file, "mode": args.mode, "ctx": C, "windows": n_win, "tokens": scored,
           "nll_per_token": nll / scored, "perplexity": math.exp(nll / scored),
           "bytes": nbytes, "bits_per_byte": nll / math.log(2) / nbytes}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
