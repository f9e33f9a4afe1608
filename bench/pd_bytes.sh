#!/usr/bin/env bash
# Bytes shipped per prompt token and the share of the transfer hidden behind compute
# (docs/pd.md): a prefill node and a decode node (exact kernels) on MODEL, one prompt of each
# length in turn (random ids below VOCAB); prints the decode node's transfer metrics and the
# prefill node's per-request lines (first page sent, prefill done, DONE sent).
#   bench/pd_bytes.sh MODEL VOCAB LEN...
set -u
cd "$(dirname "$0")/.."
M=$1 V=$2; shift 2
TMP=$(mktemp -d /tmp/ds41-pdbytes.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
waitport() { for _ in $(seq 1 600); do p=$(sed -n "s/.*$2\([0-9]*\).*/\1/p" "$1" 2>/dev/null | head -n 1); [ -n "$p" ] && { echo "$p"; return 0; }; sleep 0.1; done; return 1; }
./ds41 serve -m "$M" --exact -c 4096 --spec off --role prefill --port 0 >"$TMP/p.log" 2>&1 &
PIDS+=($!)
pport=$(waitport "$TMP/p.log" 'listening on ucx:\/\/127.0.0.1:') || { cat "$TMP/p.log"; exit 1; }
./ds41 serve -m "$M" --exact -c 4096 --spec off --role decode --prefill 127.0.0.1:$pport --port 0 >"$TMP/d.log" 2>&1 &
PIDS+=($!)
port=$(waitport "$TMP/d.log" 'listening on http:\/\/127.0.0.1:') || { cat "$TMP/d.log"; exit 1; }
for n in "$@"; do
    python3 -c "import json, random; r = random.Random($n); json.dump([[r.randrange(3, $V) for _ in range($n)]], open('$TMP/q.json', 'w'))"
    python3 tests/pd/client.py "$port" "$TMP/q.json" 1 >/dev/null || echo "request of $n tokens failed"
done
curl -s "localhost:$port/metrics" | grep -E '^ds41:(remote|kv_transfer_(bytes_total|seconds_sum|seconds_count))'
grep 'ds41 prefill node: request' "$TMP/p.log" | sed 's/.*: \([0-9]* blocks\)/\1/'
