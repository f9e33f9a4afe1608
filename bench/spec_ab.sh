#!/usr/bin/env bash
# `--spec auto` against `--spec off`, interleaved A/B (issue 26 item 4; docs/speculative.md):
#   run:   ds41 run -n N on each model, the two modes alternating in order round by round;
#          decode tokens/s from its stderr line and the process's CPU time (perf stat
#          task-clock: on a shared machine the wall clock also measures the other processes),
#          the medians of the per-round ratios auto / off
#   serve: one server per mode (ports picked by the kernel), ds41 bench-serve at each
#          concurrency against them in alternating order; output tokens/s, median ratio
# Usage: bench/spec_ab.sh [ROUNDS] [MODEL_DIR...]   (default 7 rounds, models/demo and a
# random-weight small43 with a test tokenizer written once into build/spec-ab/). One JSON
# object per measurement on stdout (for bench/plot.py), a summary table on stderr.
# Env: DS41 (default ./ds41), N (run tokens, 256), CONC (1,4), PROMPTS (8), OUT_LEN (64), T (1).
set -u
cd "$(dirname "$0")/.."
DS41=${DS41:-./ds41}
PY=/usr/bin/python3
ROUNDS=${1:-7}
shift 2>/dev/null || true
N=${N:-256}; CONC=${CONC:-1,4}; PROMPTS=${PROMPTS:-8}; OUT_LEN=${OUT_LEN:-64}; T=${T:-1}
TMP=$(mktemp -d /tmp/ds41-specab.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT INT TERM

models=("$@")
if [ ${#models[@]} -eq 0 ]; then
    ck=build/spec-ab/small43
    if [ ! -f "$ck/.complete" ] || ! cmp -s "$ck/config.json" tests/configs/small43/config.json; then
        rm -rf "$ck"
        mkdir -p build/spec-ab
        $PY tools/make_checkpoint.py tests/configs/small43 "$ck" --seed 1 --token-map stub -q &&
            $PY tests/serve/make_tokenizer.py "$ck" 500 >/dev/null && touch "$ck/.complete" || { echo "spec_ab: cannot write $ck" >&2; exit 1; }
    fi
    models=(models/demo "$ck")
fi

prompt_for() { case "$1" in models/demo*) echo "Telescope, n. 1.";; *) echo "the quick brown fox";; esac; }

# run_tps MODEL MODE -> "decode_tokens/s cpu_ms" of one ds41 run
run_tps() {
    perf stat -x, -e task-clock -o "$TMP/perf" "$DS41" run -m "$1" -p "$(prompt_for "$1")" -n "$N" -t "$T" --spec "$2" \
        2>"$TMP/run.err" >/dev/null
    echo "$(sed -n 's/.*decode [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$TMP/run.err") $(sed -n 's/^\([0-9.]*\),msec,task-clock.*/\1/p' "$TMP/perf")"
}

cpu_ms_of() {   # PID -> its CPU time so far (user + system), ms
    awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) * 1000 / hz }' "/proc/$1/stat"
}

serve_start() {   # MODEL MODE -> sets PORT, SPID
    "$DS41" serve -m "$1" --port 0 -t "$T" --parallel 8 --spec "$2" >"$TMP/serve-$2.log" 2>&1 &
    SPID=$!
    PIDS+=($!)
    PORT=
    for _ in $(seq 1 600); do
        PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/serve-$2.log")
        [ -n "$PORT" ] && return 0
        sleep 0.1
    done
    echo "spec_ab: the $2 server did not start: $(tail -n 3 "$TMP/serve-$2.log")" >&2
    return 1
}

summary() {   # reads the JSON lines of this run, prints the medians
    $PY - "$TMP/all.jsonl" <<'EOF' >&2
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(r["model"], r["path"], r.get("concurrency", 0)) for r in rows})
print("%-28s %-6s %5s %10s %10s %8s %12s %s" % ("model", "path", "conc", "off tok/s", "auto tok/s", "auto/off",
      "cpu off/auto", "rounds"))
for k in keys:
    rs = [r for r in rows if (r["model"], r["path"], r.get("concurrency", 0)) == k]
    off = [r["off"] for r in rs]; auto = [r["auto"] for r in rs]
    ratio = [r["auto"] / r["off"] for r in rs if r["off"] > 0]
    cpu = [r["off_cpu_ms"] / r["auto_cpu_ms"] for r in rs if r.get("auto_cpu_ms")]
    print("%-28s %-6s %5s %10.1f %10.1f %8.3f %12s %d" % (k[0], k[1], k[2] or "-", st.median(off), st.median(auto),
          st.median(ratio) if ratio else float("nan"), "%.3f" % st.median(cpu) if cpu else "-", len(rs)))
EOF
}

: >"$TMP/all.jsonl"
for m in "${models[@]}"; do
    # a first run of each mode untimed: the verify-width curve is measured and cached once
    run_tps "$m" auto >/dev/null; run_tps "$m" off >/dev/null
    for r in $(seq 1 "$ROUNDS"); do
        if [ $((r % 2)) = 1 ]; then a=$(run_tps "$m" off); b=$(run_tps "$m" auto); else b=$(run_tps "$m" auto); a=$(run_tps "$m" off); fi
        set -- $a 0 0; at=$1 ac=$2; set -- $b 0 0; bt=$1 bc=$2
        echo "{\"model\":\"$m\",\"path\":\"run\",\"round\":$r,\"n\":$N,\"off\":${at:-0},\"auto\":${bt:-0},\"off_cpu_ms\":${ac:-0},\"auto_cpu_ms\":${bc:-0}}" | tee -a "$TMP/all.jsonl"
    done
    serve_start "$m" off || exit 1; P_OFF=$PORT; S_OFF=$SPID
    serve_start "$m" auto || exit 1; P_AUTO=$PORT; S_AUTO=$SPID
    IFS=, read -ra cs <<<"$CONC"
    for r in $(seq 1 "$ROUNDS"); do
        for c in "${cs[@]}"; do
            # output tokens/s and the server's CPU ms for the run
            bs() { local c0 t; c0=$(cpu_ms_of "$2")
                   t=$("$DS41" bench-serve --port "$1" --concurrency "$c" --num-prompts "$PROMPTS" --output-len "$OUT_LEN" \
                       --input-len 64 --json 2>/dev/null | sed -n 's/.*"output_throughput":\([0-9.]*\).*/\1/p')
                   echo "${t:-0} $(awk -v a="$c0" -v b="$(cpu_ms_of "$2")" 'BEGIN { print b - a }')"; }
            if [ $((r % 2)) = 1 ]; then a=$(bs "$P_OFF" "$S_OFF"); b=$(bs "$P_AUTO" "$S_AUTO"); else b=$(bs "$P_AUTO" "$S_AUTO"); a=$(bs "$P_OFF" "$S_OFF"); fi
            set -- $a; at=$1 ac=$2; set -- $b; bt=$1 bc=$2
            echo "{\"model\":\"$m\",\"path\":\"serve\",\"round\":$r,\"concurrency\":$c,\"off\":$at,\"auto\":$bt,\"off_cpu_ms\":$ac,\"auto_cpu_ms\":$bc}" | tee -a "$TMP/all.jsonl"
        done
    done
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    PIDS=()
done
summary
