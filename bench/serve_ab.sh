#!/usr/bin/env bash
# Two ds41 binaries (two builds, e.g. before and after a change) serving the same model with the
# same flags, measured interleaved: ds41 bench-serve at each concurrency against server A, then B
# (B first in even rounds), output tokens/s and the server's CPU ms per run; the medians and the
# median of the per-round ratios B / A. Both servers stay up for the whole run.
# Usage: bench/serve_ab.sh A_BIN B_BIN MODEL_DIR [ROUNDS]
# Env: SERVE_ARGS (default "--spec fixed:3 --parallel 8"), CONC (1,4,8), PROMPTS (16), OUT_LEN (64),
#      IN_LEN (64), T (1: threads per server; the two share the machine, so keep T x 2 <= cores).
# One JSON line per measurement on stdout, the summary on stderr.
set -u
cd "$(dirname "$0")/.."
A=$1 B=$2 M=$3 ROUNDS=${4:-5}
SERVE_ARGS=${SERVE_ARGS:---spec fixed:3 --parallel 8}
CONC=${CONC:-1,4,8}; PROMPTS=${PROMPTS:-16}; OUT_LEN=${OUT_LEN:-64}; IN_LEN=${IN_LEN:-64}; T=${T:-1}
TMP=$(mktemp -d /tmp/ds41-serveab.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT INT TERM
cpu_ms_of() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) * 1000 / hz }' "/proc/$1/stat"; }
start() {   # BIN TAG -> PORT, SPID
    # shellcheck disable=SC2086
    "$1" serve -m "$M" --port 0 -t "$T" $SERVE_ARGS >"$TMP/serve-$2.log" 2>&1 &
    SPID=$!; PIDS+=($!); PORT=
    for _ in $(seq 1 600); do
        PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/serve-$2.log")
        [ -n "$PORT" ] && return 0
        sleep 0.1
    done
    echo "serve_ab: server $2 did not start: $(tail -n 3 "$TMP/serve-$2.log")" >&2; exit 1
}
start "$A" a; PA=$PORT SA=$SPID
start "$B" b; PB=$PORT SB=$SPID
bs() {   # PORT PID CONC -> "tok/s cpu_ms"
    local c0 t; c0=$(cpu_ms_of "$2")
    t=$(./ds41 bench-serve --port "$1" --concurrency "$3" --num-prompts "$PROMPTS" --output-len "$OUT_LEN" \
        --input-len "$IN_LEN" --json 2>/dev/null | sed -n 's/.*"output_throughput":\([0-9.]*\).*/\1/p')
    echo "${t:-0} $(awk -v a="$c0" -v b="$(cpu_ms_of "$2")" 'BEGIN { print b - a }')"
}
IFS=, read -ra cs <<<"$CONC"
for c in "${cs[@]}"; do bs "$PA" "$SA" "$c" >/dev/null; bs "$PB" "$SB" "$c" >/dev/null; done   # warm-up, untimed
: >"$TMP/all.jsonl"
for r in $(seq 1 "$ROUNDS"); do
    for c in "${cs[@]}"; do
        if [ $((r % 2)) = 1 ]; then a=$(bs "$PA" "$SA" "$c"); b=$(bs "$PB" "$SB" "$c"); else b=$(bs "$PB" "$SB" "$c"); a=$(bs "$PA" "$SA" "$c"); fi
        set -- $a $b
        echo "{\"round\":$r,\"concurrency\":$c,\"a\":$1,\"b\":$3,\"a_cpu_ms\":$2,\"b_cpu_ms\":$4}" | tee -a "$TMP/all.jsonl"
    done
done
/usr/bin/python3 - "$TMP/all.jsonl" "$A" "$B" <<'PY' >&2
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
print("A = %s, B = %s" % (sys.argv[2], sys.argv[3]))
print("%5s %10s %10s %8s %14s %s" % ("conc", "A tok/s", "B tok/s", "B/A", "cpu/token A/B", "rounds"))
for c in sorted({r["concurrency"] for r in rows}):
    rs = [r for r in rows if r["concurrency"] == c]
    ratio = [r["b"] / r["a"] for r in rs if r["a"] > 0]
    cpu = [(r["a_cpu_ms"] / r["a"]) / (r["b_cpu_ms"] / r["b"]) for r in rs if r["a"] > 0 and r["b"] > 0 and r["b_cpu_ms"] > 0]
    print("%5d %10.1f %10.1f %8.3f %14s %d" % (c, st.median(r["a"] for r in rs), st.median(r["b"] for r in rs),
          st.median(ratio) if ratio else float("nan"), "%.3f" % st.median(cpu) if cpu else "-", len(rs)))
PY
