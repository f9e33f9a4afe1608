#!/usr/bin/python3
"""The plots of `make bench` (issue 26), from saved results, so they can be redrawn without
measuring again:

    bench/plot.py RESULTS_DIR OUT_DIR

RESULTS_DIR (bench/run.sh writes build/bench-results/) may hold:
  kernels.txt         bench_kernels' output: the probed read bandwidth and FMA peak, and one
                      line per linear (ms/call, GB/s, GMAC/s at each T and thread count)
  prefill-NAME.json   `ds41 bench --json` (prefill seconds per prompt length, ced and full)
  serve-NAME.jsonl    `ds41 bench-serve --json`, one object per concurrency
  spec_ab.jsonl       bench/spec_ab.sh's rows (auto / off per round)
and writes whichever of kernels.png, serving.png, prefill.png, spec_ab.png it has data for
(matplotlib from Debian, python3-matplotlib; the Agg backend, no display needed). Prints the
files written; exits 1 when there was nothing to plot or a file could not be parsed.
"""
import glob
import json
import os
import re
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def finish(fig, out):
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def parse_kernels(path):
    """{'probes': {threads: (GB/s, GMAC/s)}, 'rows': [(name, shape, T, threads, gbs, gmacs)], 'isa': str}"""
    probes, rows, isa = {}, [], ""
    pr = re.compile(r"^threads (\d+): read bandwidth ([\d.]+) GB/s; FMA peak [\d.]+ GFLOP/s = ([\d.]+) GMAC/s")
    lr = re.compile(r"^(\S+ \S+)\s+(\d+x\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
    for line in open(path, errors="replace"):
        m = pr.match(line)
        if m:
            probes[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
            continue
        m = lr.match(line)
        if m:
            rows.append((m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), float(m.group(6)), float(m.group(7))))
            continue
        if line.startswith("== fast kernels ISA path:"):
            isa = line.split(":", 1)[1].split("(")[0].strip()
    return {"probes": probes, "rows": rows, "isa": isa}


def plot_kernels(k, out):
    rows = k["rows"]
    if not rows:
        return False
    thr = max(t for (_, _, _, t, _, _) in rows)
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    # decode (T = 1): weight bytes per second against the probed read bandwidth
    d = [r for r in rows if r[2] == 1 and r[3] == thr]
    ax[0].barh([r[0] for r in d], [r[4] for r in d], color="#4c72b0")
    if thr in k["probes"]:
        bw = k["probes"][thr][0]
        ax[0].axvline(bw, color="#c44e52", ls="--", label="probed read bandwidth %.1f GB/s" % bw)
        ax[0].legend(loc="lower right", fontsize=8)
    ax[0].set_xlabel("GB/s of packed weights")
    ax[0].set_title("decode (T = 1), %d thread%s" % (thr, "s" if thr > 1 else ""))
    # prefill / batched (largest T): multiply-adds per second against the probed FMA peak
    tmax = max(r[2] for r in rows)
    p = [r for r in rows if r[2] == tmax and r[3] == thr]
    ax[1].barh([r[0] for r in p], [r[5] for r in p], color="#55a868")
    if thr in k["probes"]:
        pk = k["probes"][thr][1]
        ax[1].axvline(pk, color="#c44e52", ls="--", label="probed FMA peak %.1f GMAC/s" % pk)
        ax[1].legend(loc="lower right", fontsize=8)
    ax[1].set_xlabel("GMAC/s")
    ax[1].set_title("T = %d rows, %d thread%s" % (tmax, thr, "s" if thr > 1 else ""))
    fig.suptitle("fast linears at production shapes against the machine (bench_kernels, ISA %s)" % (k["isa"] or "?"))
    return finish(fig, out)


def plot_prefill(files, out):
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    n = 0
    for f in files:
        name = os.path.basename(f)[len("prefill-"):-len(".json")]
        o = json.load(open(f))
        by = {}
        for mode, style in (("ced", "-o"), ("full", "--s")):
            pts = sorted((r["tokens"], r["seconds"]) for r in o.get("prefill", []) if r["mode"] == mode)
            by[mode] = dict(pts)
            if pts:
                ax[0].plot([p[0] for p in pts], [p[1] for p in pts], style, label="%s %s" % (name, mode))
                n += 1
        common = sorted(set(by.get("ced", {})) & set(by.get("full", {})))
        if common:
            ax[1].plot(common, [by["ced"][t] / by["full"][t] for t in common], "-o", label="%s measured" % name)
    if not n:
        plt.close(fig)
        return False
    # the production layer plan (small43 has it): the 20 encoder layers compute every row,
    # decoder layer L = 20..39 its last min(N, 1 + (39 - L) x 127), so CED computes
    # (20 N + sum of those) / 40 N of a full prefill's layer-rows (0.65 at N = 4096)
    xs = [2 ** k for k in range(5, 16)]
    ax[1].plot(xs, [(20 * x + sum(min(x, 1 + (39 - L) * 127) for L in range(20, 40))) / (40 * x) for x in xs],
               ":", color="gray", label="production plan: layer-rows computed")
    ax[0].set_xscale("log", base=2)
    ax[0].set_yscale("log")
    ax[0].set_xlabel("prompt tokens")
    ax[0].set_ylabel("prefill seconds")
    ax[0].set_title("prefill time, CED and full")
    ax[1].set_xscale("log", base=2)
    ax[1].set_xlabel("prompt tokens")
    ax[1].set_ylabel("CED time / full time")
    ax[1].set_ylim(0, 1.3)
    ax[1].axhline(1.0, color="k", lw=0.8)
    ax[1].set_title("what CED saves (lower is better)")
    for a in ax:
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle("prefill: the causal encoder-decoder split (CED) against a full prefill (ds41 bench)")
    return finish(fig, out)


def plot_serving(files, out):
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    n = 0
    for f in files:
        name = os.path.basename(f)[len("serve-"):-len(".jsonl")]
        rs = sorted((json.loads(line) for line in open(f) if line.strip()), key=lambda r: r["concurrency"])
        rs = [r for r in rs if r.get("completed")]
        if not rs:
            continue
        c = [r["concurrency"] for r in rs]
        ax[0].plot(c, [r["output_throughput"] for r in rs], "-o", label=name)
        ax[1].plot(c, [r["median_tpot_ms"] for r in rs], "-o", label="%s TPOT (median)" % name)
        ax[1].plot(c, [r["median_ttft_ms"] for r in rs], "--s", label="%s TTFT (median)" % name)
        n += 1
    if not n:
        plt.close(fig)
        return False
    for a in ax:
        a.set_xscale("log", base=2)
        a.set_xlabel("concurrent requests")
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    ax[0].set_ylabel("output tokens/s (all requests)")
    ax[0].set_title("ds41 serve throughput")
    ax[1].set_yscale("log")
    ax[1].set_ylabel("ms")
    ax[1].set_title("latency: time per output token, time to first token")
    fig.suptitle("ds41 bench-serve against ds41 serve (continuous batching)")
    return finish(fig, out)


def plot_spec_ab(path, out):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    groups = {}
    for r in rows:
        key = "%s\n%s%s" % (os.path.basename(r["model"]), r["path"], " c=%d" % r["concurrency"] if "concurrency" in r else "")
        g = groups.setdefault(key, {"wall": [], "cpu": []})
        if r["off"] > 0:
            g["wall"].append(r["auto"] / r["off"])
        if r.get("auto_cpu_ms"):
            g["cpu"].append(r["off_cpu_ms"] / r["auto_cpu_ms"])
    if not groups:
        return False
    keys = sorted(groups)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = range(len(keys))
    ax.bar([i - 0.2 for i in x], [statistics.median(groups[k]["wall"]) if groups[k]["wall"] else 0 for k in keys],
           0.4, label="throughput auto / off (wall clock)")
    ax.bar([i + 0.2 for i in x], [statistics.median(groups[k]["cpu"]) if groups[k]["cpu"] else 0 for k in keys],
           0.4, label="CPU time off / auto")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.98, color="#c44e52", ls="--", lw=0.8, label="0.98 (the target)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(keys, fontsize=8)
    meds = [statistics.median(g[m]) for g in groups.values() for m in ("wall", "cpu") if g[m]]
    ax.set_ylim(0.8, max(1.2, max(meds + [1.0]) * 1.05))
    ax.set_ylabel("median of per-round ratios")
    ax.set_title("--spec auto against --spec off (bench/spec_ab.sh, interleaved rounds)")
    ax.legend(fontsize=8)
    return finish(fig, out)


def main():
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    src, dst = sys.argv[1], sys.argv[2]
    if not os.path.isdir(src):
        print("plot.py: %s is not a directory (run make bench first, or pass a saved results folder)" % src,
              file=sys.stderr)
        return 1
    os.makedirs(dst, exist_ok=True)
    wrote = []
    try:
        if os.path.exists(os.path.join(src, "kernels.txt")):
            if plot_kernels(parse_kernels(os.path.join(src, "kernels.txt")), os.path.join(dst, "kernels.png")):
                wrote.append("kernels.png")
        pf = sorted(glob.glob(os.path.join(src, "prefill-*.json")))
        if pf and plot_prefill(pf, os.path.join(dst, "prefill.png")):
            wrote.append("prefill.png")
        sf = sorted(glob.glob(os.path.join(src, "serve-*.jsonl")))
        if sf and plot_serving(sf, os.path.join(dst, "serving.png")):
            wrote.append("serving.png")
        sp = os.path.join(src, "spec_ab.jsonl")
        if os.path.exists(sp) and plot_spec_ab(sp, os.path.join(dst, "spec_ab.png")):
            wrote.append("spec_ab.png")
    except (ValueError, KeyError, TypeError) as e:
        print("plot.py: cannot read the results in %s: %s" % (src, e), file=sys.stderr)
        return 1
    if not wrote:
        print("plot.py: nothing to plot in %s" % src, file=sys.stderr)
        return 1
    for w in wrote:
        print(os.path.join(dst, w))
    return 0


if __name__ == "__main__":
    sys.exit(main())
