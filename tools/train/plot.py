#!/usr/bin/env python3
"""Loss curve of a training run: OUT/log.jsonl -> PNG (train loss per logged step, held-out loss
where evaluated, phase boundaries). train.py calls it at the end of a run.

    python3 tools/train/plot.py build/demo-train/log.jsonl models/demo/loss.png"""

import json
import sys


def plot(log_path, png_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    recs = [json.loads(l) for l in open(log_path) if l.strip()]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    lm = [r for r in recs if r["phase"] != "dspark"]
    ax.plot([r["step"] for r in lm], [r["loss"] for r in lm], lw=1, label="train loss (nats/token)")
    ho = [r for r in lm if "heldout" in r]
    if ho:
        ax.plot([r["step"] for r in ho], [r["heldout"] for r in ho], "o-", ms=4, label="held-out loss")
    dr = [r for r in recs if r["phase"] == "dspark"]
    if dr:
        ax.plot([r["step"] for r in dr], [r["loss"] for r in dr], lw=1, label="DSpark draft loss")
    prev = None
    for r in recs:
        if r["phase"] != prev and prev is not None:
            ax.axvline(r["step"], color="grey", lw=0.6, ls="--")
            ax.text(r["step"], ax.get_ylim()[1] * 0.97, " " + r["phase"], fontsize=8, va="top", color="grey")
        prev = r["phase"]
    ax.set_xlabel("optimizer step (2 workers x 8 x 256 tokens)")
    ax.set_ylabel("loss")
    ax.set_title("ds41 demo model (V4.1 architecture, 12.2M parameters)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)


if __name__ == "__main__":
    plot(sys.argv[1], sys.argv[2])
