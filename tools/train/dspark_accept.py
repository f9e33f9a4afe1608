#!/usr/bin/env python3
"""Acceptance of a model's DSpark drafter by draft position: greedy `ds41 run --spec fixed:K
-n N --ignore-eos --json` on six fixed prompts (the four training sources: KJV, GCIDE,
Jargon File, fortunes), the verify steps of all six summed.

    python3 tools/train/dspark_accept.py -m models/demo [-k 5] [-n 64] [--ds41 ./ds41] [--exact]

Prints one line per prompt and the totals: steps, acceptance by position (accepted_at /
drafted_at: position i is accepted when drafts 1..i all are), mean accepted length and tokens
per verify step; --json prints the totals as one object."""

import argparse
import json
import subprocess
import sys

PROMPTS = [
    "And God said unto Noah,",
    "In the beginning God created the heaven and the earth.",
    "The LORD is my shepherd;",
    "Telescope, n. 1.",
    "kludge n. ",
    "A fool and his money",
]


def run(ds41, model, prompt, k, n, exact):
    cmd = [ds41, "run", "-m", model, "-p", prompt, "-n", str(n), "--ignore-eos", "--spec", "fixed:%d" % k,
           "--json", "-t", "1"] + (["--exact"] if exact else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    timing = json.loads(out.strip().splitlines()[-1])["timing"]
    return timing["spec"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="models/demo")
    ap.add_argument("-k", type=int, default=5)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--ds41", default="./ds41")
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    steps = accepted = emitted = 0
    dr = [0] * args.k
    ac = [0] * args.k
    for p in PROMPTS:
        s = run(args.ds41, args.model, p, args.k, args.n, args.exact)
        steps += s["steps"]
        accepted += s["accepted"]
        emitted += s["emitted"]
        for i in range(args.k):
            dr[i] += s["drafted_at"][i]
            ac[i] += s["accepted_at"][i]
        if not args.json:
            print("%-58s %3d steps, accepted by position %s" % (json.dumps(p), s["steps"],
                                                             " ".join("%.3f" % a for a in s["acceptance_at"][:args.k])))
    rate = [a / d if d else 0.0 for a, d in zip(ac, dr)]
    tot = {"model": args.model, "k": args.k, "n": args.n, "prompts": PROMPTS, "steps": steps, "accepted": accepted,
           "acceptance_by_position": [round(r, 4) for r in rate], "mean_accepted": accepted / steps if steps else 0.0,
           "tokens_per_step": emitted / steps if steps else 0.0}
    if args.json:
        print(json.dumps(tot))
    else:
        print("total: %d verify steps; acceptance by position %s; mean accepted length %.3f; %.3f tokens per step"
              % (steps, " ".join("%.3f" % r for r in rate), tot["mean_accepted"], tot["tokens_per_step"]))


if __name__ == "__main__":
    sys.exit(main())
