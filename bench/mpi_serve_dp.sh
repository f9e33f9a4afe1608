#!/usr/bin/env bash
# serve under mpiexec -n 2, replicated attention against --dp-attention against one process
# (docs/distributed.md; MODES="one replicated split split1" puts --split layers, pipelined and
# one batch at a time through the stages, in the place of dp): ds41 bench-serve at each concurrency against each server in turn (one
# server up at a time: an idle job's ranks poll for rank 0's records), ROUNDS interleaved rounds;
# the median output tok/s and its ratio to one process, and per rank the sequences it held and
# the most state (and global KV pages) they held at once (the DS41_MPI_VERBOSE counters).
# Every server: fast kernels, -t 1 per rank, --spec off (SPEC=MODE: --spec MODE, e.g. fixed:3;
# the one process too), no prefix cache (bench-serve's prompts
# differ, so it would only add the probes). Rank 0 under --dp-attention also counts the bytes the
# other ranks answer it with (per row that got a token or logits). DS41_BASE=BINARY adds a
# column per dp or split mode: base-dp, base-split (that mode with that binary: an earlier
# build, for a before/after in one run).
#   bench/mpi_serve_dp.sh CKPT [ROUNDS] [CONCURRENCY] [NUM_PROMPTS] [OUTPUT_LEN]
set -u
ck=${1:?checkpoint}; rounds=${2:-2}; conc=${3:-1,4,8}; np=${4:-16}; ol=${5:-32}; modes=${MODES:-one replicated dp}
DS41=${DS41:-./ds41}
TMP=$(mktemp -d /tmp/ds41-servedp.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
port_of() {   # port_of LOG: the port the server printed (at most ~60 s)
    local i p
    for i in $(seq 1 600); do
        p=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$1" 2>/dev/null)
        [ -n "$p" ] && { echo "$p"; return 0; }
        sleep 0.1
    done
    return 1
}
export DS41_BENCH_TAG=$TMP   # finds this script's rank 0 (SIGTERM to it ends the job; to mpiexec, every rank at once)
rank0_pid() {
    local f p
    for f in $(grep -lzx "DS41_BENCH_TAG=$TMP" /proc/[0-9]*/environ 2>/dev/null); do
        p=${f#/proc/}; p=${p%/environ}
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = ds41 ] && grep -qzx "PMI_RANK=0" "/proc/$p/environ" 2>/dev/null && echo "$p"
    done | head -n 1
}
[ -n "${DS41_BASE:-}" ] && for m in $modes; do case $m in dp|split) modes="$modes base-$m" ;; esac; done
for r in $(seq 1 "$rounds"); do
    for mode in $modes; do
        flags="-m $ck --port 0 -t 1 --spec ${SPEC:-off} --no-prefix-cache"
        case $mode in
            one) "$DS41" serve $flags >/dev/null 2>"$TMP/e.$mode.$r" & ;;
            replicated) DS41_MPI_VERBOSE=1 mpiexec -n 2 "$DS41" serve $flags >/dev/null 2>"$TMP/e.$mode.$r" & ;;
            dp) DS41_MPI_VERBOSE=1 mpiexec -n 2 "$DS41" serve $flags --dp-attention >/dev/null 2>"$TMP/e.$mode.$r" & ;;
            base-dp) DS41_MPI_VERBOSE=1 mpiexec -n 2 "$DS41_BASE" serve $flags --dp-attention >/dev/null 2>"$TMP/e.$mode.$r" & ;;
            split) DS41_MPI_VERBOSE=1 mpiexec -n 2 "$DS41" serve $flags --split layers >/dev/null 2>"$TMP/e.$mode.$r" & ;;
            base-split) DS41_MPI_VERBOSE=1 mpiexec -n 2 "$DS41_BASE" serve $flags --split layers >/dev/null 2>"$TMP/e.$mode.$r" & ;;
            split1) DS41_MPI_VERBOSE=1 mpiexec -n 2 "$DS41" serve $flags --split layers --pipe-batches 1 >/dev/null 2>"$TMP/e.$mode.$r" & ;;
        esac
        job=$!
        p=$(port_of "$TMP/e.$mode.$r") || { echo "$mode: the server did not start: $(tail -n 2 "$TMP/e.$mode.$r")" >&2; kill "$job"; exit 1; }
        "$DS41" bench-serve --port "$p" --concurrency "$conc" --num-prompts "$np" --output-len "$ol" --json >"$TMP/o.$mode.$r" ||
            { echo "$mode: bench-serve failed" >&2; kill "$job"; exit 1; }
        if [ "$mode" = one ]; then kill -TERM "$job"; else kill -TERM "$(rank0_pid)"; fi
        wait "$job"
    done
done
python3 - "$TMP" "$rounds" $modes <<'PY'
import json, re, statistics, sys
tmp, rounds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
tps = {}
for m in modes:
    for r in range(1, rounds + 1):
        for line in open(f"{tmp}/o.{m}.{r}"):
            o = json.loads(line)
            tps.setdefault((m, o["concurrency"]), []).append(o["output_throughput"])
concs = sorted({c for (_, c) in tps})
print("output tok/s, median of %d rounds (ratio to one process)" % rounds)
print("%-12s" % "concurrency" + "".join("%22s" % m for m in modes))
for c in concs:
    base = statistics.median(tps[("one", c)])
    row = "%-12d" % c
    for m in modes:
        v = statistics.median(tps[(m, c)])
        row += "%22s" % ("%.1f (%.2fx)" % (v, v / base))
    print(row)
print("state held per rank (the most at once over the runs)")
pat = re.compile(r"\[rank (\d+)\]: ([a-z -]+): (\d+) sequences held here, at most (\d+) bytes of state at once \((\d+) of them global KV pages\)(?:; rank 0's copies of the other ranks' sequences: at most (\d+) bytes)?")
ans = re.compile(r"their answers: (\d+) bytes, (\d+) rows with a token, (\d+) with logits")
for m in modes[1:]:
    b = t = l = 0
    for r in range(1, rounds + 1):
        for g in ans.finditer(open(f"{tmp}/e.{m}.{r}").read()):
            b, t, l = b + int(g.group(1)), t + int(g.group(2)), l + int(g.group(3))
    if t + l:
        print("  %-10s the other ranks' answers to rank 0: %d B for %d rows (%d with a token, %d with logits): %.1f B per row"
              % (m, b, t + l, t, l, b / (t + l)))
for m in modes[1:]:
    best = {}
    for r in range(1, rounds + 1):
        for g in pat.finditer(open(f"{tmp}/e.{m}.{r}").read()):
            k = int(g.group(1))
            v = (int(g.group(3)), int(g.group(4)), int(g.group(5)), int(g.group(6) or 0))
            o = best.get(k, (0, 0, 0, 0))
            best[k] = tuple(max(a, b) for a, b in zip(o, v))
    for k in sorted(best):
        s, st, kv, cp = best[k]
        extra = ", copies of other ranks' sequences %d B" % cp if cp else ""
        print("  %-10s rank %d: %d sequences per run, state %d B, global KV pages %d B%s" % (m, k, s, st, kv, extra))
PY
