#!/usr/bin/env bash
# Bytes shipped per prompt token, the share of the transfer hidden behind compute and the
# decode node's time from the last frame received (RESUME, or the last LAYER frame of a
# build without it) to the first token (docs/pd.md): a prefill node
# and a decode node (exact kernels, spec off) on MODEL, one prompt of each length in turn (random
# ids below VOCAB), each streamed with max_tokens 1. Prints per prompt the decode node's line
# (blocks, bytes, session ready after the last frame) and the first token's arrival after the
# last frame (the client's and the decode node's CLOCK_MONOTONIC are the same clock), then the
# transfer metrics and the prefill node's per-request lines. Both --pd-decoder modes of the
# prefill node in one run, one pair each (PD_DECODERS, bench/pd_nodes.sh). DS41=BINARY to
# measure another build.
#   bench/pd_bytes.sh MODEL VOCAB LEN...
set -u
cd "$(dirname "$0")/.."
M=$1 V=$2; shift 2
. bench/pd_nodes.sh
for mode in $(pd_modes); do
pd_mode "$mode"
echo "== --pd-decoder $mode"
start_pair
for n in "$@"; do
    t=$(python3 - "$port" "$n" "$V" <<'PY'
import json, random, sys, time, urllib.request
port, n, v = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
r = random.Random(n)
body = {"prompt": [r.randrange(3, v) for _ in range(n)], "max_tokens": 1, "temperature": 0, "stream": True}
req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
first = None
with urllib.request.urlopen(req, timeout=600) as resp:
    for line in resp:
        if first is None and line.startswith(b"data: {"):
            first = time.monotonic()
print("%.6f" % first if first else "none")
PY
)
    line=$(grep 'remote prefill from' "$TMP/d.log" | tail -n 1)
    last=$(echo "$line" | sed -n 's/.*(monotonic \([0-9.]*\)).*/\1/p')
    echo "prompt $n: ${line#*remote prefill from }"
    [ -n "$last" ] && [ "$t" != none ] && python3 -c "print('prompt $n: first token %.2f ms after the last frame' % (($t - $last) * 1e3))"
done
curl -s "localhost:$port/metrics" | grep -E '^ds41:(remote|kv_transfer_(bytes_total|seconds_sum|seconds_count))'
grep 'ds41 prefill node: request' "$TMP/p.log" | sed 's/.*: \([0-9]* blocks\)/\1/'
kill -9 $PP $DP
wait $PP $DP 2>/dev/null
done
