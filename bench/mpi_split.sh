#!/usr/bin/env bash
# ds41 bench in one process, under mpiexec -n N with the experts split (the default) and with
# the layers split (--split layers), in one run on one machine: prefill and decode tok/s, the
# bytes each token put on the wire (all ranks together, from the DS41_MPI_VERBOSE counters) and
# each rank's peak RSS. docs/distributed.md, "Pipeline parallelism".
#   bench/mpi_split.sh CKPT [LIST] [extra ds41 bench args...]      (LIST default "2 3")
set -u
ck=${1:?checkpoint}; list=${2:-2 3}; shift 2 2>/dev/null || shift $#
DS41=${DS41:-./ds41}
TMP=$(mktemp -d /tmp/ds41-mpisplit.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
runs="1:experts"
for n in $list; do runs="$runs $n:experts $n:layers"; done
for r in $runs; do
    n=${r%%:*} split=${r#*:}
    DS41_MPI_VERBOSE=1 timeout 900 mpiexec -n "$n" "$DS41" bench -m "$ck" --lengths 32 --modes ced --decode 8 --json \
        --split "$split" "$@" >"$TMP/o.$n.$split" 2>"$TMP/e.$n.$split" ||
        { echo "mpiexec -n $n --split $split failed: $(tail -n 2 "$TMP/e.$n.$split")" >&2; exit 1; }
done
python3 - "$TMP" $runs <<'PY'
import json, re, sys
tmp, runs = sys.argv[1], sys.argv[2:]
print("%-3s %-8s %12s %12s %14s %18s %16s  %s" % ("N", "split", "prefill t/s", "decode t/s", "wire B/run",
      "experts B/row/rank", "stream B/row/hop", "peak RSS MiB per rank"))
for r in runs:
    n, split = r.split(":")
    o = json.loads(open(f"{tmp}/o.{n}.{split}").read().strip().splitlines()[-1])
    err = open(f"{tmp}/e.{n}.{split}").read()
    # in rank order (the ranks' lines come in any order): "ds41: ..." is rank 0
    rss = [int(k) / 1024 for _, k in sorted((int(r or 0), k) for r, k in
           re.findall(r"^ds41(?: \[rank (\d+)\])?: .*peak RSS (\d+) KiB", err, re.M))] or [o["peak_rss_bytes"] / 2**20]
    # every rank's bytes sent in the whole bench run (the same work in every row of the table):
    # expert exchange + Engram rows, or the stream's hops + the logits and tokens from the last stage
    xr = [(int(a), int(b)) for a, b in re.findall(r"exchanges over (\d+) rows: (\d+) bytes sent", err)]
    eg = sum(int(m) for m in re.findall(r"engram: rows .*?exchange: \d+ steps, \d+ rows, (\d+) bytes sent", err))
    hop = [(int(a), int(b)) for a, b in re.findall(r"pipe: .*?sent \d+ hops (\d+) rows (\d+) bytes", err)]
    lg = sum(int(m) for m in re.findall(r"logits sent (\d+) bytes", err))
    lg += sum(int(m) for m in re.findall(r"logits sent \d+ bytes, tokens (\d+) bytes", err))   # ids after the last stage
    sent = sum(b for _, b in xr) + eg + sum(b for _, b in hop) + lg
    xrow = sum(b for _, b in xr) / sum(a for a, _ in xr) if sum(a for a, _ in xr) else 0
    hrow = sum(b for _, b in hop) / sum(a for a, _ in hop) if sum(a for a, _ in hop) else 0
    print("%-3s %-8s %12.2f %12.3f %14d %18s %16s  %s" % (n, split if n != "1" else "-", o["prefill"][0]["tokens_per_s"],
          o["decode"]["tokens_per_s"], sent, "%.0f" % xrow if xrow else "-", "%.0f" % hrow if hrow else "-",
          " ".join("%.0f" % x for x in rss)))
PY
