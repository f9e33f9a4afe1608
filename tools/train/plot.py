#!/usr/bin/env python3
"""Loss curve of a training run: OUT/log.jsonl -> PNG (train loss per logged step, held-out loss
where evaluated, phase boundaries). train.py calls it at the end of a run. --vision: the curve of
make train-vision from its state (answer loss per kind, held-out answers, held-out text loss).

    python3 tools/train/plot.py build/demo-train/log.jsonl models/demo/loss.png
    python3 tools/train/plot.py --vision build/demo-vision/vision_state.pt models/demo/vision.png [TITLE]"""

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


KIND_COLOUR = {"colour": "C0", "count": "C1", "where": "C2", "caption": "C3"}


def plot_vision(state_path, png_path, title="ds41 demo model learns to see (make train-vision)"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch
    log = torch.load(state_path)["log"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110)
    tr = [r for r in log if "kind_loss" in r and r["kind_loss"]]
    for k in ("colour", "count", "where", "caption"):
        pts = [(r["step"], r["kind_loss"][k]) for r in tr if k in r["kind_loss"]]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1, color=KIND_COLOUR[k], label="%s answers" % k)
    tx = [r for r in tr if "text" in r]
    ax.plot([r["step"] for r in tx], [r["text"] for r in tx], lw=0.6, color="grey", label="mixed text windows")
    ax.set_yscale("log")
    ax.set_xlabel("step (16 scenes + 2 text windows)")
    ax.set_ylabel("train loss, nats per answer token")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ev = [r for r in log if r.get("eval")]
    ax2.plot([r["step"] for r in ev], [100 * r["eval"]["accuracy"] for r in ev], "o-", ms=4, color="k",
             label="held-out answers right (%)")
    for k in ("colour", "count", "where"):
        ax2.plot([r["step"] for r in ev], [100 * r["eval"][k]["correct"] / r["eval"][k]["n"] for r in ev],
                 lw=0.8, color=KIND_COLOUR[k], label=k)
    ax2.set_xlabel("step")
    ax2.set_ylabel("% of the held-out scenes (teacher-forced = greedy)")
    th = [r for r in log if "text_heldout" in r]
    a3 = ax2.twinx()
    a3.plot([r["step"] for r in th], [r["text_heldout"] for r in th], "s--", ms=3, color="grey",
            label="held-out text loss")
    a3.set_ylabel("held-out text loss (nats/token)")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8, loc="center right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png_path)


if __name__ == "__main__":
    if sys.argv[1] == "--vision":
        plot_vision(sys.argv[2], sys.argv[3], *sys.argv[4:5])
    else:
        plot(sys.argv[1], sys.argv[2])
