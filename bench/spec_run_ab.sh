#!/usr/bin/env bash
# `ds41 run --spec off` against `--spec auto`, interleaved A/B of single runs (issue 26 item 4;
# docs/speculative.md "auto against off"): every round runs each binary in each mode once, in
# an order that alternates round by round (so a drift of the machine's load lands on both
# modes), and reads the decode tokens/s from the run's stderr line and, with perf, the process's
# page faults (deterministic for a binary and its arguments: the work measure next to the
# timings on a VM without hardware counters) and task-clock.
# Usage: bench/spec_run_ab.sh ROUNDS [ds41 run arguments ...]
#   default arguments: -m models/demo -p "Telescope, n. 1." -n 256 -t 1
# Env: BINS="label=path ..." (default "ds41=./ds41"): binaries to compare in the same rounds
#   (e.g. BINS="main=/tmp/main/ds41 branch=./ds41" for a before / after on the same machine state).
# Prints per binary and mode the median and quartiles of decode tok/s, the median of the
# per-round ratios auto / off, the page faults (median; min-max) and task-clock, and the load
# average before and after; one line per run on stdout with RAW=1.
set -u
cd "$(dirname "$0")/.."
ROUNDS=${1:-41}
shift 2>/dev/null || true
if [ $# -eq 0 ]; then set -- -m models/demo -p "Telescope, n. 1." -n 256 -t 1; fi
BINS=${BINS:-ds41=./ds41}
TMP=$(mktemp -d /tmp/ds41-specrun.XXXXXX)
trap 'rm -rf "$TMP"' EXIT INT TERM
have_perf=0
perf stat -x, -e page-faults -o "$TMP/p" true 2>/dev/null && have_perf=1
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
: >"$TMP/all"
for r in $(seq 1 "$ROUNDS"); do
    combos=()
    for b in $BINS; do for m in off auto; do combos+=("$b:$m"); done; done
    if [ $((r % 2)) -eq 0 ]; then   # reversed order every other round
        rev=(); for ((i = ${#combos[@]} - 1; i >= 0; i--)); do rev+=("${combos[$i]}"); done; combos=("${rev[@]}")
    fi
    for c in "${combos[@]}"; do
        lab=${c%%=*}; rest=${c#*=}; bin=${rest%:*}; mode=${rest##*:}
        if [ $have_perf = 1 ]; then
            perf stat -x, -e page-faults,task-clock -o "$TMP/perf" "$bin" run "$@" --spec "$mode" 2>"$TMP/err" >/dev/null
        else
            "$bin" run "$@" --spec "$mode" 2>"$TMP/err" >/dev/null
            : >"$TMP/perf"
        fi
        tps=$(sed -n 's/.*decode [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$TMP/err")
        pf=$(sed -n 's/^\([0-9]*\),,page-faults.*/\1/p' "$TMP/perf")
        tc=$(sed -n 's/^\([0-9.]*\),msec,task-clock.*/\1/p' "$TMP/perf")
        echo "$r $lab $mode ${tps:-nan} ${pf:-nan} ${tc:-nan}" >>"$TMP/all"
        [ "${RAW:-0}" = 1 ] && echo "$r $lab $mode ${tps:-nan} ${pf:-nan} ${tc:-nan}"
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
/usr/bin/python3 - "$TMP/all" <<'PY' >&2
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1])]
def q(v):
    v = sorted(v); n = len(v)
    return v[n // 4], st.median(v), v[(3 * n) // 4]
labs = []
for r in rows:
    if r[1] not in labs: labs.append(r[1])
print("%-8s %-5s %22s %10s %14s %10s" % ("binary", "mode", "tok/s q1 / median / q3", "auto/off", "page faults", "task ms"))
for lab in labs:
    by = {m: {int(r[0]): r for r in rows if r[1] == lab and r[2] == m} for m in ("off", "auto")}
    ratios = [float(by["auto"][k][3]) / float(by["off"][k][3]) for k in by["off"] if k in by["auto"]]
    for m in ("off", "auto"):
        t = [float(r[3]) for r in by[m].values()]
        pf = [float(r[4]) for r in by[m].values() if r[4] != "nan"]
        tc = [float(r[5]) for r in by[m].values() if r[5] != "nan"]
        a, b, c = q(t)
        pfs = "%d (%d-%d)" % (st.median(pf), min(pf), max(pf)) if pf else "-"
        rq = q(ratios) if m == "auto" else None
        print("%-8s %-5s %7.0f / %6.0f / %6.0f %10s %14s %10s" % (lab, m, a, b, c,
              "%.3f [%.3f-%.3f]" % (rq[1], rq[0], rq[2]) if rq else "", pfs, "%.1f" % st.median(tc) if tc else "-"))
PY
