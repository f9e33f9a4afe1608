#!/usr/bin/env bash
# The prefix cache through the commands, on the demo model (exact kernels):
#   - ds41 run --cache-dir: a second run of a 600-token prompt restores its whole blocks from
#     disk and prints the same 12 tokens (--ignore-eos: the demo model may end its answer sooner)
#     and top logprobs as a run without the cache; approx
#     replay runs; usage errors (--replay value, --cache-dir with --trace) exit 2, a cache dir
#     that is a file exits 1 naming it;
#   - ds41 serve: a two-turn chat whose second request repeats the first turn: /metrics counts
#     the cached tokens (vllm:prefix_cache_hits), and the answer equals a --no-prefix-cache
#     server's; after a restart over the same --cache-dir the blocks come from disk (same answer).
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./ds41}
PY=${PYTHON:-/usr/bin/python3}
TMP=$(mktemp -d /tmp/ds41-prefix.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
. tests/lib.sh
M=models/demo
# a ~600-token prompt: the first paragraphs of the GPL (every Debian has it)
PROMPT=$(head -c 2400 /usr/share/common-licenses/GPL-3 | tr '\n' ' ')
printf '%s' "$PROMPT" >"$TMP/prompt.txt"

# ---------------------------------------------------------------- ds41 run
"$DS41" run -m $M -p "$PROMPT" -n 12 --ignore-eos --exact --json --top-logprobs 3 >"$TMP/plain.json" 2>"$TMP/plain.err" ||
    fail run_plain "$(tail -n 2 "$TMP/plain.err")"
"$DS41" run -m $M -p "$PROMPT" -n 12 --ignore-eos --exact --json --top-logprobs 3 --cache-dir "$TMP/store" >"$TMP/c1.json" 2>"$TMP/c1.err" ||
    fail run_cache_first "$(tail -n 2 "$TMP/c1.err")"
"$DS41" run -m $M -p "$PROMPT" -n 12 --ignore-eos --exact --json --top-logprobs 3 --cache-dir "$TMP/store" >"$TMP/c2.json" 2>"$TMP/c2.err" ||
    fail run_cache_second "$(tail -n 2 "$TMP/c2.err")"
"$PY" - "$TMP" <<'EOF' && pass run_cache_dir_exact || fail run_cache_dir_exact "see above"
import json, sys
t = sys.argv[1]
def load(n):
    lines = open(f"{t}/{n}.json").read().splitlines()
    return lines[:-1], json.loads(lines[-1])["timing"]
plain, _ = load("plain")
c1, t1 = load("c1")
c2, t2 = load("c2")
ok = True
if t1["prefix_cache"]["restored_tokens"] != 0 or t1["prefix_cache"]["blocks_written"] < 4:
    print("  first run:", t1["prefix_cache"]); ok = False
n = t2["prefill_tokens"]
if t2["prefix_cache"]["restored_tokens"] != (n // 128) * 128 or t2["prefix_cache"]["disk_blocks_read"] != n // 128:
    print("  second run:", t2["prefix_cache"], "prompt", n); ok = False
if not (plain == c1 == c2) or len(plain) != 12:
    print("  token lines differ:", len(plain), len(c1), len(c2)); ok = False
sys.exit(0 if ok else 1)
EOF
# a damaged store file (a flipped byte in the third block the prompt reads, then a truncated
# fourth) is a miss, never served: the run restores the blocks before it, prefills the rest and
# prints the same tokens; ds41 cache verify names the damage first
"$PY" - "$TMP" "$DS41" <<'EOF2' && pass run_cache_damaged_block || fail run_cache_damaged_block "see above"
import json, os, subprocess, sys
t, ds41 = sys.argv[1], sys.argv[2]
ls = subprocess.run([ds41, "cache", "ls", "--cache-dir", f"{t}/store", "--json"], capture_output=True, text=True)
blocks = json.loads(ls.stdout)
blocks = blocks.get("blocks", blocks) if isinstance(blocks, dict) else blocks
by_key = {b["key"]: b for b in blocks}
# the chain of the prompt: the block whose parent is all zero, then its child, ...
chain, parent = [], "0" * 32
while True:
    nxt = [b for b in blocks if b["parent"] == parent]
    if not nxt: break
    chain.append(nxt[0]); parent = nxt[0]["key"]
ok = len(chain) >= 4
def path(b):
    return b.get("path") or os.path.join(f"{t}/store", b["fingerprint"], b["key"] + ".blk")
p3, p4 = path(chain[2]), path(chain[3])
with open(p3, "r+b") as f:
    f.seek(os.path.getsize(p3) // 2); c = f.read(1); f.seek(-1, 1); f.write(bytes([c[0] ^ 0x10]))
os.truncate(p4, os.path.getsize(p4) - 100)
v = subprocess.run([ds41, "cache", "verify", "--cache-dir", f"{t}/store"], capture_output=True, text=True)
if v.returncode != 1: print("  verify exit", v.returncode, v.stdout[-300:], v.stderr[-300:]); ok = False
r = subprocess.run([ds41, "run", "-m", "models/demo", "-p", open(f"{t}/prompt.txt").read(), "-n", "12", "--ignore-eos", "--exact",
                    "--json", "--top-logprobs", "3", "--cache-dir", f"{t}/store"], capture_output=True, text=True)
lines = r.stdout.splitlines()
plain = open(f"{t}/plain.json").read().splitlines()
pc = json.loads(lines[-1])["timing"]["prefix_cache"] if lines else {}
if r.returncode or lines[:-1] != plain[:-1] or pc.get("restored_tokens") != 256:
    print("  run after damage:", r.returncode, pc, r.stderr[-300:]); ok = False
sys.exit(0 if ok else 1)
EOF2
"$DS41" run -m $M -p "$PROMPT" -n 4 --exact --replay approx --cache-dir "$TMP/store" >/dev/null 2>"$TMP/ap.err" &&
    grep -q "approx replay of 64 rows" "$TMP/ap.err" && pass run_cache_approx || fail run_cache_approx "$(tail -n 2 "$TMP/ap.err")"
"$DS41" run -m $M -p x --replay sometimes >/dev/null 2>"$TMP/u1.err"; rc=$?
[ $rc -eq 2 ] && grep -q "replay" "$TMP/u1.err" && pass run_replay_usage || fail run_replay_usage "rc $rc"
"$DS41" run -m $M -p x --cache-dir "$TMP/store" --trace "$TMP/tr" >/dev/null 2>"$TMP/u2.err"; rc=$?
[ $rc -eq 2 ] && pass run_cache_trace_usage || fail run_cache_trace_usage "rc $rc"
touch "$TMP/afile"
"$DS41" run -m $M -p x -n 1 --cache-dir "$TMP/afile" >/dev/null 2>"$TMP/u3.err"; rc=$?
[ $rc -eq 1 ] && grep -q "afile" "$TMP/u3.err" && pass run_cache_dir_is_file || fail run_cache_dir_is_file "rc $rc: $(cat "$TMP/u3.err")"

# ---------------------------------------------------------------- ds41 serve
start() { local name=$1; shift; serve_start "$name" -m $M --exact --spec off "$@"; }
stop() { kill -TERM "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; }
# chat PORT OUT: the two-turn conversation; writes the answers and the prefix-cache counters
chat() {
    "$PY" - "$1" "$2" "$PROMPT" <<'EOF'
import json, sys, urllib.request
port, out, system = sys.argv[1], sys.argv[2], sys.argv[3]
def post(msgs):
    body = json.dumps({"model": "demo", "messages": msgs, "max_tokens": 24, "temperature": 0}).encode()
    r = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                                      {"Content-Type": "application/json"}), timeout=300)
    return json.load(r)["choices"][0]["message"]["content"]
def metrics():
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read().decode()
    v = {}
    for line in text.splitlines():
        for k in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
            if line.startswith(k + "{"): v[k] = float(line.split()[-1])
    return v
msgs = [{"role": "system", "content": system}, {"role": "user", "content": "What does licence mean?"}]
a1 = post(msgs)
m1 = metrics()
msgs += [{"role": "assistant", "content": a1}, {"role": "user", "content": "What does software mean?"}]
a2 = post(msgs)
m2 = metrics()
json.dump({"a1": a1, "a2": a2, "m1": m1, "m2": m2}, open(out, "w"))
EOF
}
if start cached --cache-dir "$TMP/sstore"; then
    chat "$PORT" "$TMP/s1.json" || fail serve_chat_cached "client failed"
    stop
fi
if start nocache --no-prefix-cache; then
    chat "$PORT" "$TMP/s0.json" || fail serve_chat_nocache "client failed"
    stop
fi
if start restarted --cache-dir "$TMP/sstore"; then
    chat "$PORT" "$TMP/s2.json" || fail serve_chat_restarted "client failed"
    stop
fi
# a generation that takes longer than --timeout before its first byte (a 2,000-token exact
# prefill against a 1 s idle timeout) is not cut off: the timeout is for idle clients (not
# under the sanitizers: a timing rule, 35 s there, on the server code the cases above run)
if [ -z "${DS41_ASAN:-}" ] && start slowfirst --no-prefix-cache --timeout 1; then
    "$PY" - "$PORT" "$(head -c 9000 /usr/share/common-licenses/GPL-3 | tr '\n' ' ')" <<'EOF' && pass serve_slow_first_byte_kept || fail serve_slow_first_byte_kept "see above"
import http.client, json, sys, time
port, prompt = sys.argv[1], sys.argv[2]
c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=300)
t0 = time.time()
c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": 4, "stream": True}),
          {"Content-Type": "application/json"})
r = c.getresponse()
done = any(line.strip() == b"data: [DONE]" for line in r)
print(f"  stream after {time.time() - t0:.1f} s: {'complete' if done else 'cut off'}")
sys.exit(0 if done else 1)
EOF
    stop
fi
"$PY" - "$TMP" <<'EOF' && pass serve_prefix_multiturn || fail serve_prefix_multiturn "see above"
import json, sys
t = sys.argv[1]
s0, s1, s2 = (json.load(open(f"{t}/{n}.json")) for n in ("s0", "s1", "s2"))
ok = True
if s0["m2"]:
    print("  --no-prefix-cache server reports prefix cache metrics", s0["m2"]); ok = False
h1 = s1["m1"].get("vllm:prefix_cache_hits", -1)
q2 = s1["m2"]["vllm:prefix_cache_queries"] - s1["m1"]["vllm:prefix_cache_queries"]
h2 = s1["m2"]["vllm:prefix_cache_hits"] - h1
if h1 != 0 or h2 < 512 or h2 > q2:
    print(f"  turn 1 hits {h1}, turn 2 hits {h2} of {q2} prompt tokens"); ok = False
# after the restart the first request already hits (its blocks are on disk)
if s2["m1"].get("vllm:prefix_cache_hits", 0) < 512:
    print("  restarted server, turn 1 hits", s2["m1"]); ok = False
for k in ("a1", "a2"):
    if not (s0[k] == s1[k] == s2[k]):
        print(f"  {k} differs: {s0[k]!r} / {s1[k]!r} / {s2[k]!r}"); ok = False
print(f"  turn 2: {int(h2)} of {int(q2)} prompt tokens restored from the cache")
sys.exit(0 if ok else 1)
EOF
