#!/usr/bin/env bash
# ds41 bench under mpiexec -n N for N in LIST, rounds interleaved (N = 1, 2, 3, then again),
# on one machine: prefill and decode tok/s (medians over the rounds), bytes each rank sent per
# exchanged row and its peak RSS, the Engram row exchange's bytes sent and wait per step and
# rank (DS41_MPI_VERBOSE=1 counters). docs/distributed.md.
#   bench/mpi_scale.sh CKPT [ROUNDS] [LIST] [extra ds41 bench args...]
set -u
ck=${1:?checkpoint}; rounds=${2:-2}; list=${3:-1 2 3}; shift 3 2>/dev/null || shift $#
DS41=${DS41:-./ds41}
TMP=$(mktemp -d /tmp/ds41-mpiscale.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
for r in $(seq 1 "$rounds"); do
    for n in $list; do
        DS41_MPI_VERBOSE=1 timeout 900 mpiexec -n "$n" "$DS41" bench -m "$ck" --lengths 32 --modes ced --decode 8 --json "$@" \
            >"$TMP/o.$n.$r" 2>"$TMP/e.$n.$r" || { echo "mpiexec -n $n failed: $(tail -n 2 "$TMP/e.$n.$r")" >&2; exit 1; }
    done
done
python3 - "$TMP" "$rounds" $list <<'PY'
import json, re, statistics, sys
tmp, rounds, ns = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3:]]
print("%-3s %12s %12s %14s %14s %16s %16s %14s %16s" % ("N", "prefill t/s", "decode t/s", "decode vs N=1", "sent B/row/rank",
      "peak RSS MiB/rank", "MoE wait ms/layer", "Engram B/step", "Engram wait ms/step"))
base = None
for n in ns:
    pre, dec, sent, rss, egb, egw, xw = [], [], [], [], [], [], []
    for r in range(1, rounds + 1):
        o = json.loads(open(f"{tmp}/o.{n}.{r}").read().strip().splitlines()[-1])
        pre.append(o["prefill"][0]["tokens_per_s"]); dec.append(o["decode"]["tokens_per_s"])
        for m in re.finditer(r"(\d+) expert exchanges over (\d+) rows: (\d+) bytes sent.*?([0-9.]+) s waiting for peers; peak RSS (\d+) KiB", open(f"{tmp}/e.{n}.{r}").read()):
            sent.append(int(m.group(3)) / max(1, int(m.group(2)))); rss.append(int(m.group(5)) / 1024)
            xw.append(1e3 * float(m.group(4)) / max(1, int(m.group(1))))
        # the Engram row exchange (dist_engram.c): bytes each rank sent per step, its wait per step
        for m in re.finditer(r"engram: rows .*?exchange: (\d+) steps, \d+ rows, (\d+) bytes sent, \d+ received, ([0-9.]+) s waiting", open(f"{tmp}/e.{n}.{r}").read()):
            egb.append(int(m.group(2)) / max(1, int(m.group(1)))); egw.append(1e3 * float(m.group(3)) / max(1, int(m.group(1))))
        if n == 1: rss.append(o["peak_rss_bytes"] / 2**20)
    d = statistics.median(dec); base = base or d
    print("%-3d %12.2f %12.3f %14.2f %14s %16s %16s %14s %16s" % (n, statistics.median(pre), d, d / base,
          "%.0f" % statistics.median(sent) if sent else "0", "%.0f" % statistics.median(rss),
          "%.3f" % statistics.median(xw) if xw else "0",
          "%.0f" % statistics.median(egb) if egb else "0", "%.3f" % statistics.median(egw) if egw else "0"))
PY
