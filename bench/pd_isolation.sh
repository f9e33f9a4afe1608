#!/usr/bin/env bash
# Decode isolation A/B (docs/pd.md): the mixed load of bench/pd_mixload.py against
#   colocated: one node, both cores (-t 2);
#   split:     a prefill node on core 1 and a decode node on core 0 (taskset, -t 1 each), once
#              per --pd-decoder mode of the prefill node (PD_DECODERS, default "prefill decode";
#              "-" for a build without the option);
# PD_COLOCATED=0 skips the colocated runs (the modes' comparison alone);
# interleaved round by round (ROUNDS, default 3), fast kernels, spec off; the demo model unless
# MODEL (with its context size CTX and the random ids' bound VOCAB: the demo's context is 4096,
# too short for 8k-token prompts).
#   bench/pd_isolation.sh [ROUNDS] [LONG_LEN] [STREAM_TOKENS] [MODEL CTX VOCAB]
set -u
cd "$(dirname "$0")/.."
R=${1:-3}; LL=${2:-3000}; ST=${3:-2500}
MODES=${PD_DECODERS:-prefill decode}
M=${4:-models/demo} C=${5:-4096} V=${6:-4000}
TMP=$(mktemp -d /tmp/ds41-pdiso.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
waitport() {  # LOG PATTERN -> port
    for _ in $(seq 1 300); do
        p=$(sed -n "s/.*$2\([0-9]*\).*/\1/p" "$1" 2>/dev/null | head -n 1)
        [ -n "$p" ] && { echo "$p"; return 0; }
        sleep 0.1
    done
    return 1
}
for i in $(seq 1 "$R"); do
    if [ "${PD_COLOCATED:-1}" != 0 ]; then
        ./ds41 serve -m $M -c $C -t 2 --spec off --port 0 >"$TMP/one.log" 2>&1 &
        P=$!; PIDS+=($P)
        port=$(waitport "$TMP/one.log" 'listening on http:\/\/127.0.0.1:') || exit 1
        echo "colocated round $i $(python3 bench/pd_mixload.py "$port" 2 "$ST" 3 "$LL" "$V")"
        kill $P; wait $P 2>/dev/null
    fi
    for mode in $MODES; do
        opt=; [ "$mode" = - ] || opt="--pd-decoder $mode"
        taskset -c 1 ./ds41 serve -m $M -c $C -t 1 --spec off --role prefill $opt --port 0 >"$TMP/p.log" 2>&1 &
        PP=$!; PIDS+=($PP)
        pport=$(waitport "$TMP/p.log" 'listening on ucx:\/\/127.0.0.1:') || exit 1
        taskset -c 0 ./ds41 serve -m $M -c $C -t 1 --spec off --role decode --prefill 127.0.0.1:$pport \
            --remote-prefill-min 512 --port 0 >"$TMP/d.log" 2>&1 &
        DP=$!; PIDS+=($DP)
        port=$(waitport "$TMP/d.log" 'listening on http:\/\/127.0.0.1:') || exit 1
        echo "split ($mode) round $i $(python3 bench/pd_mixload.py "$port" 2 "$ST" 3 "$LL" "$V") remote $(curl -s localhost:$port/metrics | sed -n 's/^ds41:remote_prefills_total{[^}]*} //p') ready_ms $(sed -n 's/.*session ready \([0-9.]*\) ms.*/\1/p' "$TMP/d.log" | tr '\n' ' ')"
        kill $PP $DP; wait $PP $DP 2>/dev/null
    done
done
