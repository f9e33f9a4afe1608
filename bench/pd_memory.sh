#!/usr/bin/env bash
# Prefill node memory against a full node, measured (docs/pd.md "Roles' memory"): a prefill node
# and a decode node, then one ordinary node, on MODEL (exact kernels, spec off, one request at a
# time), after the same prompts (random ids below VOCAB, one per LEN). Prints for each process
# VmHWM, RssAnon and RssFile (/proc/PID/status) and the resident bytes of the checkpoint's
# safetensors mappings (/proc/PID/smaps), next to `ds41 inspect --role`'s arithmetic. Both
# --pd-decoder modes of the prefill node in one run (PD_DECODERS, bench/pd_nodes.sh).
#   bench/pd_memory.sh MODEL VOCAB LEN...
set -u
cd "$(dirname "$0")/.."
M=$1 V=$2; shift 2
. bench/pd_nodes.sh
send() {   # one greedy token per prompt; no client timeout under an hour (prodwidth4 on a loaded machine)
    for n in "$@"; do
        python3 - "$port" "$n" "$V" <<'PY' || echo "request of $n tokens failed"
import json, random, sys, urllib.request
port, n, v = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
r = random.Random(n)
body = {"prompt": [r.randrange(3, v) for _ in range(n)], "max_tokens": 1, "temperature": 0}
req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=3600).read()
PY
    done
}
report() {   # NAME PID
    local kb
    kb=$(awk '/safetensors/ { on = 1; next } /^[0-9a-f]+-[0-9a-f]+ / { on = 0 } on && /^Rss:/ { s += $2 } END { print s + 0 }' "/proc/$2/smaps")
    printf '%-13s %s; checkpoint mappings resident %.1f MiB\n' "$1" \
        "$(grep -E '^(VmHWM|RssAnon|RssFile)' "/proc/$2/status" | awk '{ printf "%s %.1f MiB  ", $1, $2 / 1024 }')" "$(echo "$kb / 1024" | bc -l)"
}
for mode in $(pd_modes); do
    pd_mode "$mode"
    echo "--pd-decoder $mode: $("$DS41" inspect --role prefill ${PD_DECODER:+--pd-decoder $PD_DECODER} "$M" | head -n 1)"
    start_pair
    send "$@"
    report "prefill node" $PP
    report "decode node" $DP
    kill -9 $PP $DP
done
"$DS41" inspect --role decode "$M" | head -n 1
"$DS41" serve -m "$M" --exact -c 4096 --spec off --port 0 >"$TMP/o.log" 2>&1 &
OP=$!; PIDS+=($OP)
port=$(waitport "$TMP/o.log" 'listening on http:\/\/127.0.0.1:') || { cat "$TMP/o.log"; exit 1; }
send "$@"
report "one node" $OP
