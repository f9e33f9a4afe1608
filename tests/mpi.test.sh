#!/usr/bin/env bash
# ds41 under mpiexec (docs/distributed.md): expert parallelism across 2 and 3 ranks gives tokens
# and logits bit-identical to one process (exact and fast kernels, both index-K readings,
# DSpark drafts on and off, the default placement and an --expert-map), perplexity equal, chat
# replies equal; serve's answers equal (also with --spec fixed:3 and auto, and with images; under
# --dp-attention also with --spec, --engram-mode prefetch and logits processors sampled by the
# owner); one run over TCP with shared memory off (checked with strace: the ranks connect
# over AF_INET) and one across network namespaces (veth);
# faults end the job with a clear message and a non-zero status, never a hang: a rank with
# another checkpoint, other flags or a missing shard (refused at start-up), a hung rank
# (--mpi-timeout names it), a killed rank, a malformed expert map.
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./ds41}
PY=${PYTHON:-/usr/bin/python3}
CK=build/test-ck
TMP=$(mktemp -d /tmp/ds41-mpi.XXXXXX)
# every process this test starts carries this tag, so that the cleanup finds exactly them
export DS41_MPI_TEST_TAG=$TMP
ours() {   # PIDs of this test's ds41 ranks and launchers still alive (one grep over /proc)
    local f p c
    for f in $(grep -lzx "DS41_MPI_TEST_TAG=$TMP" /proc/[0-9]*/environ 2>/dev/null); do
        p=${f#/proc/}; p=${p%/environ}
        c=$(cat "/proc/$p/comm" 2>/dev/null) || continue
        case $c in ds41|ds41-watch|ds41-guard|mpiexec*|hydra_pmi_proxy|strace) echo "$p" ;; esac
    done
}
cleanup() {
    local p
    for p in $(ours); do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
    rm -rf "$TMP"
}
trap cleanup EXIT
mkdir -p "$CK"
. tests/lib.sh
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

# ---------------------------------------------------------------- inspect --ranks (no MPI needed)
# tiny: 6 layers + 1 DSpark stage, 4 experts top-2, dim 256: each MoE layer sends 2 x 256 x 4 B
# to the 1 other rank per token, the default placement gives both ranks 2 experts per layer
if "$DS41" inspect --ranks 2 --json tests/configs/tiny >"$TMP/i.json" 2>"$TMP/i.err" &&
   "$PY" -c "
import json, sys
r = json.load(open(sys.argv[1]))['ranks']
e = [p['expert_bytes'] for p in r['per_rank']]
assert r['ranks'] == 2 and len(e) == 2 and e[0] == e[1] > 0, r
assert r['exchange_bytes_per_token_per_moe_layer'] == 2 * 256 * 4 * 1, r
assert r['exchange_bytes_per_token_per_forward'] == 6 * 2 * 256 * 4, r
assert r['per_rank'][0]['weight_bytes'] == r['replicated_bytes'] + r['per_rank'][0]['engram_bytes'] + e[0], r
# Engram (tables of 660 and 864 rows, head_dim 32: 33 B a row) split by rows: 330 + 432 rows each;
# per token 2 layers x 6 rows x 33 B travel to the 1 other rank
assert [p['engram_bytes'] for p in r['per_rank']] == [(330 + 432) * 33] * 2 and r['engram_bytes'] == (660 + 864) * 33, r
assert r['engram_sharded'] and r['engram_exchange_bytes_per_token'] == 2 * 6 * 33 * 1, r
" "$TMP/i.json"; then pass inspect_ranks_tiny; else fail inspect_ranks_tiny "$(head -c 300 "$TMP/i.err")"; fi
# --dp-attention on tiny (2 ranks, 2 of the 4 experts each, top-2): a token's row (256 + 2 x 2
# values, 1040 B) goes to the other rank unless both its choices are on its own rank (1 in
# C(4,2) = 6 pairs): 5/6 x 1040 B expected, at most 1040; its choices' outputs (1024 B each) come
# back from the other rank for half of them: 1024 B expected, at most 2048; 6 MoE layers; the KV
# of a sequence on its owner only (half the sequences a rank); the Engram rows held by the other
# rank (half) asked for with an 8-byte key: 2 layers x 6 rows x (33 + 8) B / 2
if "$DS41" inspect --ranks 2 --dp-attention --json tests/configs/tiny >"$TMP/i.json" 2>"$TMP/i.err" &&
   "$PY" -c "
import json, sys
r = json.load(open(sys.argv[1]))['ranks']
close = lambda a, b: abs(a - b) < 1e-6
assert r['attention'] == 'data-parallel' and r['kv_share_per_rank'] == 0.5, r
assert close(r['dispatch_bytes_per_token_per_moe_layer'], 5 / 6 * 1040) and r['dispatch_bytes_per_token_per_moe_layer_max'] == 1040, r
assert r['combine_bytes_per_token_per_moe_layer'] == 1024 and r['combine_bytes_per_token_per_moe_layer_max'] == 2048, r
assert close(r['exchange_bytes_per_token_per_forward'], 6 * (5 / 6 * 1040 + 1024)), r
assert r['engram_exchange_bytes_per_token'] == 2 * 6 * 41 / 2, r
" "$TMP/i.json"; then pass inspect_ranks_dp_attention; else fail inspect_ranks_dp_attention "$(head -c 300 "$TMP/i.err")"; fi
# every expert of every layer on rank 1: rank 0 holds none
printf '* 0 1\n* 1 1\n* 2 1\n* 3 1\n' >"$TMP/allmap"
if "$DS41" inspect --ranks 2 --json --expert-map "$TMP/allmap" tests/configs/tiny 2>/dev/null |
   "$PY" -c "import json,sys; r=json.load(sys.stdin)['ranks']; e=[p['expert_bytes'] for p in r['per_rank']]; sys.exit(0 if e[0] == 0 and e[1] > 0 else 1)"; then
    pass inspect_ranks_expert_map
else
    fail inspect_ranks_expert_map "rank 0 still holds experts"
fi
# the malformed --expert-map corpus: one line naming FILE:LINE, exit 1, nothing on stdout
n=0 bad=""
for d in tests/malformed/expert-map/*/; do
    "$DS41" inspect --ranks 2 --expert-map "$d/map" tests/configs/tiny >"$TMP/m.out" 2>"$TMP/m.err"; rc=$?
    n=$((n + 1))
    if [ $rc -ne 1 ] || [ "$(wc -l <"$TMP/m.err")" -ne 1 ] || ! grep -qF -- "$(cat "$d/expected")" "$TMP/m.err" || [ -s "$TMP/m.out" ]; then
        bad="$bad $(basename "$d")(exit $rc: $(head -c 200 "$TMP/m.err"))"
    fi
done
[ -z "$bad" ] && [ $n -ge 8 ] && pass "expert_map_malformed_corpus ($n cases)" || fail expert_map_malformed_corpus "$n cases;$bad"
# routing counts (bench --routing-counts) for inspect --expert-map-from: a layer past the
# model's, then a count that is not a number: FILE:LINE, exit 1, nothing on stdout
printf '0 0 5\n7 0 1\n' >"$TMP/rc-layer"; printf '# c\n0 0 x\n' >"$TMP/rc-count"
bad=""
for f in "rc-layer:2: expected a layer (0..6)" "rc-count:2: expected a count"; do
    "$DS41" inspect --ranks 2 --expert-map-from "$TMP/${f%%:*}" --write-expert-map "$TMP/never" tests/configs/tiny >"$TMP/m.out" 2>"$TMP/m.err"
    rc=$?
    { [ $rc -eq 1 ] && grep -qF -- "$f" "$TMP/m.err" && [ ! -s "$TMP/m.out" ] && [ ! -e "$TMP/never" ]; } || bad="$bad $f(exit $rc: $(head -c 200 "$TMP/m.err"))"
done
[ -z "$bad" ] && pass expert_map_from_malformed_counts || fail expert_map_from_malformed_counts "$bad"

# inspect --ranks 2 --split layers (no MPI needed): tiny's second stage may start at KV source 1
# (stages of 1.14 MB and 4.55 MB) or 3 (2.72 MB and 2.96 MB); the default takes 3, whose largest
# stage is smaller; the stages' bytes add up to the checkpoint's; a token's hop is 4 x (256 + 1)
# x 4 B, its logits row 512 x 4 B to the 1 other rank
if "$DS41" inspect --ranks 2 --split layers --json tests/configs/tiny >"$TMP/i.json" 2>"$TMP/i.err" &&
   "$PY" -c "
import json, sys
o = json.load(open(sys.argv[1])); r = o['ranks']; p = r['per_rank']
assert r['split'] == 'layers' and [(q['first_layer'], q['last_layer']) for q in p] == [(0, 2), (3, 5)], r
assert sum(q['weight_bytes'] for q in p) == o['weight_bytes'], (r, o['weight_bytes'])
assert r['hop_bytes_per_token'] == 4 * 257 * 4 and r['hops'] == 1 and r['token_bytes_per_token'] == 4 + 32, r
assert r['serve_logits_bytes_per_token'] == 512 * 4 + 32, r
assert [q['kv_bytes_per_token'] for q in p] == [35.0, 70.0], r   # KV sources 1 (ratio 2) and 3 (ratio 1)
assert [h['bytes_per_token'] for h in r['per_hop']] == [4 * 257 * 4], r   # a KV source: the stream alone
" "$TMP/i.json"; then pass split_inspect_tiny; else fail split_inspect_tiny "$(head -c 300 "$TMP/i.err")"; fi
# stages that start at layers that are not KV sources (small43: the V4.1 layout, sources 2, 8,
# 14 at ratio 2 and 20 at ratio 1, candidate pool of 20 read by 24-36): the stages 22-23 and
# 24-39 each keep a replica of source 20 (36 + 34 B of main KV and index key a token), layers 0-21
# hold 3 x 70 / 2 + 70 = 175 B a token; a decode step at 65536 tokens sends into layer 22 the
# stream (4 x 257 x 4 = 4112 B), source 20's new entry (70 B), layer 20's top-k list (a 4-byte
# width and 64 ids: 260 B; 22-23 reuse it) and the pool (4 B and 8192 blocks as bits: 1028 B),
# into layer 24 (an index source itself) the stream, the entry and the pool
if "$DS41" inspect --ranks 3 --split layers:0-21,22-23,24-39 --json tests/configs/small43 >"$TMP/i.json" 2>"$TMP/i.err" &&
   "$PY" -c "
import json, sys
r = json.load(open(sys.argv[1]))['ranks']; p = r['per_rank']
assert [(q['first_layer'], q['last_layer']) for q in p] == [(0, 21), (22, 23), (24, 39)], r
assert [q['kv_bytes_per_token'] for q in p] == [175.0, 70.0, 70.0], r
assert [q['replica_kv_bytes_per_token'] for q in p] == [0.0, 70.0, 70.0], r
assert [(h['layer'], h['bytes_per_token']) for h in r['per_hop']] == [(22, 4112 + 70 + 260 + 1028), (24, 4112 + 70 + 1028)], r
" "$TMP/i.json"; then pass split_inspect_off_source; else fail split_inspect_off_source "$(head -c 300 "$TMP/i.err")"; fi

if ! command -v mpiexec >/dev/null || "$DS41" --help 2>&1 | grep -q "this build has no MPI"; then
    echo "SKIP mpi: no mpiexec or ds41 built without MPI (mpicc not on PATH at build time)"
    exit 0
fi
# under the sanitizers (make check-asan) MPICH's own allocations at MPI_Finalize are not ours
# to judge: leak checking off for this file only (the one-process tests keep it)
if [ -n "${DS41_ASAN:-}" ]; then export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"; fi
export XDG_CACHE_HOME=$TMP/cache   # the --spec auto curve: measured by this test's ranks only
RUN="timeout 120 mpiexec"   # stdin: run.sh gives /dev/null (mpiexec would forward it to rank 0)

tiny=$(checkpoint tiny) || exit 1
# inspect --ranks N --node-bandwidth: the decode projection against the bytes read from the
# checkpoint's own header (an independent sum: the backbone's tensors whole but the embedding (one
# BF16 row) and the routed experts (k/E of them, 1/N per rank), no DSpark stage, no Engram table;
# the Engram rows a token reads, 1/N per rank; the exchanges' bytes / N on the link; one latency
# per MoE layer and one for the Engram exchange); and the usage errors
proj_check() {   # proj_check N BW LINK LAT
    "$DS41" inspect --ranks "$1" --json --node-bandwidth "$2" --link "$3" --latency "$4" "$tiny" >"$TMP/p.json" 2>"$TMP/p.err" &&
    "$PY" - "$TMP/p.json" "$tiny/model.safetensors" "$tiny/config.json" "$@" <<'EOF'
import json, struct, sys
r = json.load(open(sys.argv[1]))['ranks']; q = r['projection']
f = open(sys.argv[2], 'rb'); h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
c = json.load(open(sys.argv[3])); c = c.get('text_config', c)
n, bw, link, lat = int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
k, E = c['num_experts_per_tok'], c['n_routed_experts']
repl = exp = 0
for name, t in h.items():
    if name == '__metadata__' or name.startswith('mtp.') or '.engram.embed.' in name:
        continue
    b = t['data_offsets'][1] - t['data_offsets'][0]
    if name == 'embed.weight': repl += c['hidden_size'] * 2
    elif '.ffn.experts.' in name: exp += b * k / E
    else: repl += b
eg_rows = r['engram_exchange_bytes_per_token'] / (n - 1)     # a token's Engram rows, all owners
read = repl + exp / n + eg_rows / n
wire = (r['exchange_bytes_per_token_per_forward'] + r['engram_exchange_bytes_per_token']) / n
x = c['num_hidden_layers'] + 1
ms = read / (bw * 1e9) * 1e3 + wire / (link * 1e9 / 8) * 1e3 + x * lat * 1e-3
close = lambda a, b: abs(a - b) <= 1e-9 * max(1, abs(b))
assert close(q['read_bytes_per_token_per_rank'], read) and close(q['wire_bytes_per_token_per_rank'], wire), (q, read, wire)
assert q['exchanges_per_token'] == x and close(q['ms_per_token'], ms) and close(q['tokens_per_second'], 1e3 / ms), (q, ms)
EOF
}
# --split layers: a stream's step runs the stages in turn, so the bytes read are one process's
# (the experts k/E of them, the token's Engram rows all), split over the stages by layer; each hop
# carries its cut's bytes and a 32-byte header, the sampled token 36 B to each other rank; one
# latency per hop and one for the token
proj_split_check() {   # proj_split_check N BW LINK LAT
    "$DS41" inspect --ranks "$1" --split layers --json --node-bandwidth "$2" --link "$3" --latency "$4" "$tiny" \
        >"$TMP/p.json" 2>"$TMP/p.err" &&
    "$PY" - "$TMP/p.json" "$tiny/model.safetensors" "$tiny/config.json" "$@" <<'EOF'
import json, struct, sys
r = json.load(open(sys.argv[1]))['ranks']; q = r['projection']
f = open(sys.argv[2], 'rb'); h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
c = json.load(open(sys.argv[3])); c = c.get('text_config', c)
n, bw, link, lat = int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
read = 0
for name, t in h.items():
    if name == '__metadata__' or name.startswith('mtp.') or '.engram.embed.' in name:
        continue
    b = t['data_offsets'][1] - t['data_offsets'][0]
    if name == 'embed.weight': read += c['hidden_size'] * 2
    elif '.ffn.experts.' in name: read += b * c['num_experts_per_tok'] / c['n_routed_experts']
    else: read += b
hd = c['engram_head_dim']
read += len(c['engram_layer_ids']) * (c['engram_max_ngram_size'] - 1) * c['engram_n_heads'] * (hd + hd // 32)
wire = sum(hp['bytes_per_token'] + 32 for hp in r['per_hop']) + 36
ms = read / (bw * 1e9) * 1e3 + wire / (link * 1e9 / 8) * 1e3 + n * lat * 1e-3
close = lambda a, b: abs(a - b) <= 1e-9 * max(1, abs(b))
assert len(r['per_hop']) == n - 1 and len(q['read_bytes_per_token_per_stage']) == n, q
assert close(q['read_bytes_per_token'], read) and close(sum(q['read_bytes_per_token_per_stage']), read), (q, read)
assert close(q['ms_per_token'], ms) and close(q['tokens_per_second'], 1e3 / ms), (q, ms)
assert q['busiest_stage_ms'] <= q['ms_per_token'] and close(q['pipelined_tokens_per_second'], 1e3 / q['busiest_stage_ms']), q
EOF
}
if proj_check 2 10 1 50 && proj_check 3 0.5 25 0 && proj_split_check 2 10 1 50 && proj_split_check 3 0.5 25 5 &&
   ! "$DS41" inspect --node-bandwidth 10 "$tiny" >/dev/null 2>"$TMP/p.err" && grep -q -- "--node-bandwidth goes with --ranks N" "$TMP/p.err" &&
   ! "$DS41" inspect --ranks 2 --link 10 "$tiny" >/dev/null 2>"$TMP/p.err" && grep -q -- "give it too" "$TMP/p.err" &&
   ! "$DS41" inspect --ranks 2 --node-bandwidth 0 "$tiny" >/dev/null 2>&1; then
    pass inspect_ranks_projection
else
    fail inspect_ranks_projection "$(head -c 400 "$TMP/p.err")"
fi
small=$(checkpoint small43) || exit 1
demo=models/demo

# same NAME N ARGS...: `ds41 run ARGS` alone and under mpiexec -n N: the same stdout and the
# same --dump-logits bytes (every generated step's logits row); $SAME_MPI: more mpiexec flags
# (a hostfile)
same() {
    local name=$1 n=$2; shift 2
    if ! "$DS41" run "$@" --dump-logits "$TMP/a.f32" >"$TMP/a.out" 2>"$TMP/a.err"; then
        fail "$name" "one process failed: $(tail -n 2 "$TMP/a.err")"; return
    fi
    if ! $RUN ${SAME_MPI:-} -n "$n" "$DS41" run "$@" --mpi-timeout 30 --dump-logits "$TMP/b.f32" >"$TMP/b.out" 2>"$TMP/b.err"; then
        fail "$name" "mpiexec -n $n failed: $(tail -n 3 "$TMP/b.err")"; return
    fi
    if [ ! -s "$TMP/a.f32" ]; then fail "$name" "no logits written"; return; fi
    if ! cmp -s "$TMP/a.out" "$TMP/b.out"; then fail "$name" "tokens differ: '$(head -c 80 "$TMP/a.out")' vs '$(head -c 80 "$TMP/b.out")'"; return; fi
    if ! cmp -s "$TMP/a.f32" "$TMP/b.f32"; then fail "$name" "logits differ ($(cmp "$TMP/a.f32" "$TMP/b.f32" | head -n 1))"; return; fi
    pass "$name"
}

# --spec auto from a cold curve cache: the calibration times its rounds, and as many as fit in
# 0.3 s ran on each rank (a loaded rank ran fewer collective forwards, and the job ended with
# "this rank's step differs"); every rank now runs rank 0's count. Exact speculation emits the
# plain tokens, so the reference is one process with --spec off.
if "$DS41" run -m "$demo" -p "Once upon a time" -n 16 --exact --ignore-eos --spec off >"$TMP/a.out" 2>"$TMP/a.err" &&
   XDG_CACHE_HOME=$TMP/cache-cold $RUN -n 2 "$DS41" run -m "$demo" -p "Once upon a time" -n 16 --exact --ignore-eos \
       --spec auto --mpi-timeout 30 >"$TMP/b.out" 2>"$TMP/b.err"; then
    if cmp -s "$TMP/a.out" "$TMP/b.out"; then pass spec_auto_cold_curve_demo_n2
    else fail spec_auto_cold_curve_demo_n2 "tokens differ: '$(head -c 80 "$TMP/a.out")' vs '$(head -c 80 "$TMP/b.out")'"; fi
else
    fail spec_auto_cold_curve_demo_n2 "$(tail -n 3 "$TMP/a.err" "$TMP/b.err")"
fi
P20=$(ids 20 7 512)
P90=$(ids 90 8 512)
# ---------------------------------------------------------------- exact, both readings, DSpark off/on
same exact_tiny_n2 2 -m "$tiny" --prompt-ids "$P20" -n 12 --exact --ignore-eos --spec off
same exact_tiny_n3_official 3 -m "$tiny" --prompt-ids "$P20" -n 12 --exact --ignore-eos --spec off --index-k official
same exact_tiny_n3_dspark 3 -m "$tiny" --prompt-ids "$P20" -n 12 --exact --ignore-eos --spec fixed:2
same exact_small43_n2_dspark 2 -m "$small" --prompt-ids "$P90" -n 10 --exact --ignore-eos --spec fixed:3
same exact_small43_n3_official 3 -m "$small" --prompt-ids "$P90" -n 10 --exact --ignore-eos --spec off --index-k official
same exact_demo_n2 2 -m "$demo" -p "Once upon a time" -n 24 --exact --ignore-eos --spec off
same exact_demo_n3_dspark 3 -m "$demo" -p "Once upon a time" -n 24 --exact --ignore-eos --spec fixed:3
same exact_demo_n2_official_dspark 2 -m "$demo" -p "What does Post mean?" -n 16 --exact --ignore-eos --spec fixed:3 --index-k official
# ---------------------------------------------------------------- fast kernels: identical to fast in one process
same fast_demo_n2 2 -m "$demo" -p "Once upon a time" -n 24 --ignore-eos --spec off
same fast_demo_n3_dspark 3 -m "$demo" -p "Once upon a time" -n 24 --ignore-eos --spec fixed:3
same fast_small43_n3 3 -m "$small" --prompt-ids "$P90" -n 8 --ignore-eos --spec off
# ---------------------------------------------------------------- an expert map: every expert of layer 0 on rank 1, expert 0 everywhere on rank 0
printf '# test map\n0 0 1\n0 1 1\n0 2 1\n* 0 0   # hot expert\n\n0 3 1\n' >"$TMP/map"
same expert_map_demo_n2 2 -m "$demo" -p "Once upon a time" -n 12 --exact --ignore-eos --spec off --expert-map "$TMP/map"
# ---------------------------------------------------------------- bench under mpiexec; its routing counts -> a balanced map
# bench --routing-counts alone and under mpiexec -n 2: the job completes, rank 0 alone prints
# (one table), the counts equal the one process's (the router is replicated); inspect
# --expert-map-from balances them (per layer an equal number of experts per rank, the busiest
# rank's share of the counted load no larger than under the default) and writes the map; run
# --exact with that map under mpiexec -n 2 gives the one process's tokens and logits
BARGS="-m $tiny --lengths 16 --modes full --decode 4 --exact --settle never"
if "$DS41" bench $BARGS --routing-counts "$TMP/routes-1" >"$TMP/a.out" 2>"$TMP/a.err" &&
   $RUN -n 2 "$DS41" bench $BARGS --routing-counts "$TMP/routes-2" --mpi-timeout 30 >"$TMP/b.out" 2>"$TMP/b.err"; then
    if [ "$(grep -c '^kernels:' "$TMP/b.out")" != 1 ] || [ "$(grep -c '^decode after' "$TMP/b.out")" != 1 ]; then
        fail bench_n2_rank0_output "not one table on stdout: $(head -c 300 "$TMP/b.out")"
    elif ! diff <(grep -v '^#' "$TMP/routes-1") <(grep -v '^#' "$TMP/routes-2") >/dev/null || [ "$(grep -vc '^#' "$TMP/routes-1")" != 28 ]; then
        fail bench_n2_rank0_output "routing counts differ or are not 7 layers x 4 experts"
    else
        pass bench_n2_rank0_output
    fi
else
    fail bench_n2_rank0_output "$(tail -n 3 "$TMP/a.err" "$TMP/b.err")"
fi
if "$DS41" inspect --ranks 2 --json --expert-map-from "$TMP/routes-2" --write-expert-map "$TMP/balmap" "$tiny" >"$TMP/i.json" 2>"$TMP/i.err" &&
   "$PY" -c "
import json, sys
r = json.load(open(sys.argv[1]))['ranks']; p = r['per_rank']
assert p[0]['expert_bytes'] == p[1]['expert_bytes'] > 0, r
assert max(q['routed_share'] for q in p) <= max(q['routed_share_default'] for q in p), r
m = [tuple(map(int, l.split())) for l in open(sys.argv[2]) if not l.startswith('#')]
assert m and all(sum(1 for l, e, k in m if l == L and k == 0) == 2 for L in {l for l, _, _ in m}), m
" "$TMP/i.json" "$TMP/balmap"; then
    same expert_map_from_counts_tiny_n2 2 -m "$tiny" --prompt-ids "$P20" -n 8 --exact --ignore-eos --spec off --expert-map "$TMP/balmap"
else
    fail expert_map_from_counts_tiny_n2 "$(head -c 300 "$TMP/i.err")"
fi
# threads per rank (-t 2 on each of 2 ranks) and a hostfile naming localhost: fast mode's tokens
# and logits equal one process's at -t 2
same fast_tiny_n2_t2 2 -m "$tiny" --prompt-ids "$P20" -n 8 --ignore-eos --spec off -t 2
printf 'localhost:2\n' >"$TMP/hosts"
SAME_MPI="-f $TMP/hosts" same hostfile_localhost_tiny_n2 2 -m "$tiny" --prompt-ids "$P20" -n 8 --exact --ignore-eos --spec off
# one rank per NUMA node (hydra binds through hwloc; this machine has one node, so this checks
# the launch and the bits, not the placement)
SAME_MPI="-bind-to numa" same bind_numa_tiny_n2 2 -m "$tiny" --prompt-ids "$P20" -n 8 --exact --ignore-eos --spec off

# ---------------------------------------------------------------- each rank's experts only
# tiny-bigexperts (tiny with 2048-wide experts: 256 KiB a weight tensor, 11.7 MB of experts a
# rank at -n 2): every rank's DS41_MPI_VERBOSE line counts the routed experts' bytes present in
# its page tables (/proc/self/pagemap). Its own experts must be there (the tokens ran through
# them: the count sees reads); of the other ranks' experts none of the pages in the runs it
# advised apart (dist_mpi.c advise_others: whole pages of runs of adjacent tensors), only pages
# it shares with its own tensors at a run's ends. Without the advice the kernel mapped about
# half of the other rank's bytes around this rank's faults (fault-around and large folios,
# measured by hand); a rank that ran another rank's expert would show its pages.
bigx=$(checkpoint tiny-bigexperts) || exit 1
xres_check() {   # xres_check NAME N [run flags]
    local name=$1 n=$2
    shift 2
    if ! DS41_MPI_VERBOSE=1 timeout 120 mpiexec -n "$n" "$DS41" run -m "$bigx" --prompt-ids "$P20" -n 8 --ignore-eos --spec off \
        "$@" >"$TMP/x.out" 2>"$TMP/x.err"; then
        fail "$name" "status $?: $(tail -c 300 "$TMP/x.err")"
        return
    fi
    if "$PY" - "$TMP/x.err" "$n" <<'PYEOF'; then pass "$name"; else fail "$name" "$(grep 'routed experts' "$TMP/x.err" | head -c 600)"; fi
import re, sys
pat = re.compile(r"^ds41(?: \[rank (\d+)\])?: routed experts in this rank's page tables: its own (\d+) of (\d+) bytes; "
                 r"the other ranks' (\d+) of (\d+) bytes, (\d+) of the (\d+) in their (\d+) runs advised apart$")
rows = {}
for line in open(sys.argv[1]):
    m = pat.match(line.strip())
    if m:
        rows[int(m.group(1) or 0)] = [int(x) for x in m.groups()[1:]]
n = int(sys.argv[2])
assert sorted(rows) == list(range(n)), rows
total = rows[0][1] + rows[0][3]
assert sum(r[1] for r in rows.values()) == total, rows       # the ranks' own experts tile them
for r, (own_res, own, oth_res, oth, adv_res, adv, runs) in rows.items():
    assert 0 < own_res <= own and own + oth == total, (r, rows[r])
    assert runs > 0 and 0 < adv <= oth and adv_res == 0, (r, rows[r])
    assert oth_res <= 2 * runs * 4096, (r, rows[r])          # a shared page at each end of a run
PYEOF
}
xres_check experts_own_pages_n2 2
xres_check experts_own_pages_n3 3
# --load copy: a rank copies the replicated tensors and its own experts into anonymous memory,
# not the other ranks' (their pages are never touched: advised out of huge pages first); the
# same check on the copy, and its tokens and logits equal one process's
xres_check experts_own_pages_copy_n2 2 --load copy
same load_copy_bigexperts_n2 2 -m "$bigx" --load copy --prompt-ids "$P20" -n 8 --exact --ignore-eos --spec off
# --readahead: a rank advises (MADV_WILLNEED) the replicated tensors and its own experts, not
# the other rank's: counted with strace, each rank's advised bytes are below one process's by
# at least a fifth (the other rank's half of the experts is 31 % of what one process advises
# here), and the bits equal one process's
if command -v strace >/dev/null; then
    ra_bytes() { grep MADV_WILLNEED "$1" | sed -E 's/^([0-9]+) .*madvise\(0x[0-9a-f]+, ([0-9]+), MADV_WILLNEED.*/\1 \2/' |
        awk '{s[$1] += $2} END {for (p in s) print s[p]}' | sort -n; }
    if timeout 120 strace -f -e trace=madvise -o "$TMP/ra1" "$DS41" run -m "$bigx" --readahead --prompt-ids 1,2,3,4 -n 4 \
           --spec off >/dev/null 2>&1 &&
       timeout 120 strace -f -e trace=madvise -o "$TMP/ra2" mpiexec -n 2 "$DS41" run -m "$bigx" --readahead \
           --prompt-ids 1,2,3,4 -n 4 --spec off >/dev/null 2>&1; then
        one=$(ra_bytes "$TMP/ra1") ranks=$(ra_bytes "$TMP/ra2" | tr '\n' ' ')
        if [ "$(echo "$ranks" | wc -w)" = 2 ] && [ -n "$one" ] &&
           [ "$(for b in $ranks; do [ $((b * 5)) -le $((one * 4)) ] && echo ok; done | wc -l)" = 2 ]; then
            pass readahead_own_experts_n2
        else
            fail readahead_own_experts_n2 "advised bytes: one process $one, ranks $ranks"
        fi
    else
        fail readahead_own_experts_n2 "a run failed"
    fi
fi
same readahead_bigexperts_n2 2 -m "$bigx" --readahead --prompt-ids "$P20" -n 8 --exact --ignore-eos --spec off

# ---------------------------------------------------------------- Engram tables sharded by rows
# tiny-bigengram (99 MB of tables): every --engram-mode gives one process's tokens and logits;
# each rank holds rows lo..hi of each table (the default split: N equal runs, the first rows % N
# ranks one more) and touches only them. DS41_MPI_VERBOSE's "engram: rows ..." line per rank
# gives the rows, their bytes, and the table bytes present in the rank's page tables
# (/proc/self/pagemap) inside and outside its rows.
big=$(checkpoint tiny-bigengram) || exit 1
# eg_check NAME N MODE: every rank's line; the rows tile the tables in rank order; the bytes held
# are the tables' 1/N (to a row); ram: the resident bytes in its rows are its rows' bytes rounded
# up to pages (at most 2 pages more per range: 2 ranges per table); mmap / prefetch: at most its
# rows. Outside its rows at most 16 MiB: the pages at the 8 range ends (2 tensors x 2 ends x 2
# tables) may be mapped with the large page-cache folio around a touched row (2 MiB each), but
# never another rank's rows in bulk (its share is 33-50 MB here).
eg_check() {
    local rc
    "$PY" - "$TMP/b.err" "$2" "$3" >"$TMP/eg.out" 2>&1 <<'PY'
import re, sys
txt, n, mode = open(sys.argv[1]).read(), int(sys.argv[2]), sys.argv[3]
pat = r"ds41(?: \[rank (\d+)\])?: engram: rows (.*?) \((\d+) bytes, (\w+)\); resident (\d+) bytes in its rows, (\d+) bytes of the tables outside them; exchange: (\d+) steps"
ranks = {int(m.group(1) or 0): m for m in re.finditer(pat, txt)}
assert sorted(ranks) == list(range(n)), sorted(ranks)
rb, hi_prev, total = 32 + 1, None, None
for r in range(n):
    m = ranks[r]
    rng = [tuple(int(v) for v in re.match(r"\s*(\d+)\.\.(\d+) of (\d+)", x).groups()) for x in m.group(2).split(",")]
    if total is None: total, hi_prev = [t for _, _, t in rng], [0] * len(rng)
    assert [lo for lo, _, _ in rng] == hi_prev, (r, rng, hi_prev)
    hi_prev = [hi for _, hi, _ in rng]
    own = int(m.group(3)); assert own == sum(hi - lo for lo, hi, _ in rng) * rb, (own, rng)
    assert abs(own - sum(total) * rb / n) <= len(rng) * rb, (own, total)
    assert m.group(4) == mode, m.group(4)
    res_in, res_out = int(m.group(5)), int(m.group(6))
    if mode == "ram": assert own <= res_in <= own + 2 * 2 * len(rng) * 4096, (res_in, own)
    else: assert res_in <= own + 2 * 2 * len(rng) * 4096, (res_in, own)
    assert res_out <= 16 << 20, res_out
    assert int(m.group(7)) > 0
assert hi_prev == total, (hi_prev, total)
PY
    rc=$?
    if [ $rc -eq 0 ]; then pass "$1"; else fail "$1" "$(tail -n 1 "$TMP/eg.out"): $(grep -h 'engram: rows' "$TMP/b.err" | head -c 300)"; fi
}
DS41_MPI_VERBOSE=1 same engram_sharded_ram_exact_n3 3 -m "$big" --prompt-ids "$P20" -n 8 --exact --ignore-eos --spec off --engram-mode ram
eg_check engram_sharded_ram_rows_n3 3 ram
DS41_MPI_VERBOSE=1 same engram_sharded_mmap_exact_n2 2 -m "$big" --prompt-ids "$P20" -n 8 --exact --ignore-eos --spec off --engram-mode mmap
eg_check engram_sharded_mmap_rows_n2 2 mmap
DS41_MPI_VERBOSE=1 same engram_sharded_prefetch_fast_n2_dspark 2 -m "$big" --prompt-ids "$P20" -n 8 --ignore-eos --spec fixed:2 --engram-mode prefetch
eg_check engram_sharded_prefetch_rows_n2 2 prefetch

# ---------------------------------------------------------------- perplexity equal (all but the timings)
head -c 1200 models/demo/MODEL_CARD.md >"$TMP/text"
if "$DS41" perplexity -m "$demo" -f "$TMP/text" -c 128 --json --exact >"$TMP/p1.json" 2>"$TMP/p1.err" &&
   $RUN -n 3 "$DS41" perplexity -m "$demo" -f "$TMP/text" -c 128 --json --exact --mpi-timeout 30 >"$TMP/p3.json" 2>"$TMP/p3.err"; then
    d=$("$PY" -c "
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
print(' '.join(sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in ('seconds', 'tokens_per_s'))))" "$TMP/p1.json" "$TMP/p3.json")
    if [ -z "$d" ] && grep -q '"perplexity"' "$TMP/p1.json"; then pass perplexity_n3; else fail perplexity_n3 "fields differ: $d"; fi
else
    fail perplexity_n3 "$(tail -n 2 "$TMP/p1.err" "$TMP/p3.err")"
fi

# ---------------------------------------------------------------- chat: rank 0 reads stdin, every rank runs the turn
printf 'What does Post mean?\n/reset\nAnd Sit?\n' >"$TMP/chat.in"
if "$DS41" chat -m "$demo" -n 16 --exact <"$TMP/chat.in" >"$TMP/c1.out" 2>"$TMP/c1.err" &&
   $RUN -n 3 "$DS41" chat -m "$demo" -n 16 --exact --mpi-timeout 30 <"$TMP/chat.in" >"$TMP/c3.out" 2>"$TMP/c3.err"; then
    if [ -s "$TMP/c1.out" ] && cmp -s "$TMP/c1.out" "$TMP/c3.out"; then pass chat_n3; else fail chat_n3 "replies differ: '$(head -c 80 "$TMP/c1.out")' vs '$(head -c 80 "$TMP/c3.out")'"; fi
else
    fail chat_n3 "$(tail -n 2 "$TMP/c1.err" "$TMP/c3.err")"
fi

# ---------------------------------------------------------------- TCP, shared memory off
# MPICH ch4: MPIR_CVAR_NOLOCAL=1 sends even same-host traffic through the network module;
# UCX_TLS=tcp,self makes that module TCP. strace shows the ranks connecting over AF_INET.
if command -v strace >/dev/null; then
    mkdir -p "$TMP/st"
    "$DS41" run -m "$demo" -p "Once upon a time" -n 12 --exact --ignore-eos --spec off >"$TMP/a.out" 2>/dev/null
    # DS41_MPI_VERBOSE=1: each rank reports its exchange counters at the end (rank 0's is checked)
    # Under strace on a loaded host, UCX's TCP teardown inside MPI_Finalize sometimes outlasts
    # ds41's 10 s finalize watchdog and hydra reports the job failed (measured 2026-12-06 with 3
    # busy loops beside the job: 7 of 34 runs under strace, 0 of 36 without it, the same binary;
    # main before this change did the same, 2 of 12; 2026-12-08, a training run at nice 19 beside
    # it: 4 of 16 with the rank watcher and 4 of 16 without, two of them in a row once). That
    # stall is strace's, not the transport check's, so such a run is retried, twice at most; any
    # other failure, or a third stall, fails.
    for try in 1 2 3; do
        rm -f "$TMP"/st/r*
        DS41_MPI_VERBOSE=1 MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NOLOCAL=1 UCX_TLS=tcp,self UCX_NET_DEVICES=lo $RUN -n 2 \
            sh -c 'exec strace --seccomp-bpf -f -e trace=connect -o "$0/r$PMI_RANK" "$@"' "$TMP/st" \
            "$DS41" run -m "$demo" -p "Once upon a time" -n 12 --exact --ignore-eos --spec off --mpi-timeout 30 >"$TMP/b.out" 2>"$TMP/b.err"
        trc=$?
        [ $trc -ne 0 ] && [ $try -lt 3 ] && grep -q 'MPI_Finalize did not return within' "$TMP/b.err" || break
        echo "tcp_no_shm_n2: MPI_Finalize stalled under strace (status $trc); once more"
    done
    if [ $trc -eq 0 ]; then
        conn=$(cat "$TMP"/st/r* | grep -c 'connect(.*AF_INET.*127\.0\.0\.1.*= 0')
        # every MoE layer of every forward went through the exchange, bytes on the wire
        xch=$(sed -n 's/^ds41: \([0-9]*\) expert exchanges over [0-9]* rows: \([0-9]*\) bytes sent.*/\1 \2/p' "$TMP/b.err")
        if [ "$conn" -ge 1 ] && cmp -s "$TMP/a.out" "$TMP/b.out" && [ "${xch%% *}" -gt 0 ] 2>/dev/null && [ "${xch##* }" -gt 0 ]; then
            pass tcp_no_shm_n2
        else
            fail tcp_no_shm_n2 "AF_INET connects $conn, exchanges/bytes '$xch', same tokens: $(cmp -s "$TMP/a.out" "$TMP/b.out" && echo yes || echo no)"
        fi
    else
        fail tcp_no_shm_n2 "mpiexec status $trc: $(tail -n 3 "$TMP/b.err")"
    fi
else
    echo "SKIP tcp_no_shm_n2: no strace to check the transport"
fi

# ---------------------------------------------------------------- across network namespaces
# one namespace per rank, linked by a veth pair (a /30 subnet picked at random), the ranks
# entered through a launcher script (ip netns exec); TCP only, each rank's UCX on its veth end.
# The veth counters must carry at least the bytes the exchange counters say were sent.
NS=ds41m$$
. tests/netns.sh
trap 'ns_cleanup; cleanup' EXIT
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && ip netns add "${NS}0" 2>/dev/null && ip netns add "${NS}1" 2>/dev/null &&
   ip link add "${NS}a" netns "${NS}0" type veth peer name "${NS}b" netns "${NS}1" 2>/dev/null; then
    ns_pair_up
    ns_launcher "$TMP/launch"
    "$DS41" run -m "$demo" -p "Once upon a time" -n 12 --exact --ignore-eos --spec off >"$TMP/a.out" 2>/dev/null
    tx0=$(ip netns exec "${NS}0" cat "/sys/class/net/${NS}a/statistics/tx_bytes")
    # hydra's "callback returned error status" (status 255) in 2 of 4 clean-clone runs on
    # 2026-12-08, quiet or loaded: retried twice at most, as tcp_no_shm_n2's UCX-TCP stall
    for try in 1 2 3; do
        DS41_MPI_VERBOSE=1 MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NOLOCAL=1 UCX_TLS=tcp,self $RUN -n 2 "$TMP/launch" \
            "$DS41" run -m "$PWD/$demo" -p "Once upon a time" -n 12 --exact --ignore-eos --spec off --mpi-timeout 30 \
            >"$TMP/b.out" 2>"$TMP/b.err"; nrc=$?
        [ $nrc -ne 255 ] && break
    done
    if [ $nrc -eq 0 ]; then
        tx1=$(ip netns exec "${NS}0" cat "/sys/class/net/${NS}a/statistics/tx_bytes")
        sent=$(sed -n 's/^ds41: [0-9]* expert exchanges over [0-9]* rows: \([0-9]*\) bytes sent.*/\1/p' "$TMP/b.err")
        if cmp -s "$TMP/a.out" "$TMP/b.out" && [ -n "$sent" ] && [ "$sent" -gt 0 ] && [ $((tx1 - tx0)) -ge "$sent" ]; then
            pass netns_veth_n2
        else
            fail netns_veth_n2 "same tokens: $(cmp -s "$TMP/a.out" "$TMP/b.out" && echo yes || echo no), rank 0 sent $sent B, veth carried $((tx1 - tx0)) B"
        fi
    else
        fail netns_veth_n2 "mpiexec status $nrc: $(tail -n 3 "$TMP/b.err")"
    fi
    ns_cleanup
else
    ns_cleanup
    echo "SKIP netns_veth_n2: needs root and ip netns"
fi

# ---------------------------------------------------------------- faults
# expect_job NAME PATTERN SECONDS CMD...: non-zero exit within SECONDS, stderr matching PATTERN
expect_job() {
    local name=$1 pat=$2 lim=$3; shift 3
    local t0=$(date +%s.%N)
    timeout 120 "$@" >"$TMP/f.out" 2>"$TMP/f.err"
    local rc=$? t=$(echo "$(date +%s.%N) - $t0" | bc)
    if [ $rc -eq 0 ]; then fail "$name" "exit status 0"; return; fi
    if [ $rc -eq 124 ] || [ "$(echo "$t > $lim" | bc)" = 1 ]; then fail "$name" "took ${t}s (limit ${lim}s, status $rc)"; return; fi
    if ! grep -q -- "$pat" "$TMP/f.err"; then fail "$name" "message '$(head -c 300 "$TMP/f.err")' lacks '$pat'"; return; fi
    pass "$name"
}
expect_job another_checkpoint "rank 1 differs from rank 0 in the checkpoint's config.json" 60 \
    mpiexec -n 1 "$DS41" run -m "$tiny" --prompt-ids 1,2,3 -n 2 --exact : -n 1 "$DS41" run -m "$small" --prompt-ids 1,2,3 -n 2 --exact
expect_job other_flags "rank 1 differs from rank 0 in the command-line flags" 60 \
    mpiexec -n 1 "$DS41" run -m "$tiny" --prompt-ids 1,2,3 -n 2 --exact : -n 1 "$DS41" run -m "$tiny" --prompt-ids 1,2,3 -n 2 --exact --index-k official
expect_job other_kernel_mode "rank 1 differs from rank 0 in the command-line flags\|rank 1 differs from rank 0 in the kernel mode" 60 \
    mpiexec -n 1 "$DS41" run -m "$tiny" --prompt-ids 1,2,3 -n 2 --exact : -n 1 "$DS41" run -m "$tiny" --prompt-ids 1,2,3 -n 2
mkdir -p "$TMP/noshard"
case $tiny in /*) t=$tiny ;; *) t=$PWD/$tiny ;; esac
ln -s "$t/config.json" "$TMP/noshard/config.json"
ln -s "$t/engram_token_map.i32" "$TMP/noshard/engram_token_map.i32"
expect_job missing_shard "rank 1: .*noshard" 60 \
    mpiexec -n 1 "$DS41" run -m "$tiny" --prompt-ids 1,2,3 -n 2 --exact : -n 1 "$DS41" run -m "$TMP/noshard" --prompt-ids 1,2,3 -n 2 --exact
# a rank whose shard ends inside an Engram table (its rows cannot be read): refused at start-up,
# rank 0 naming the rank, the file and the table
mkdir -p "$TMP/trunc"
case $big in /*) t=$big ;; *) t=$PWD/$big ;; esac
ln -s "$t/config.json" "$TMP/trunc/config.json"
ln -s "$t/engram_token_map.i32" "$TMP/trunc/engram_token_map.i32"
head -c 20000000 "$t/model.safetensors" >"$TMP/trunc/model.safetensors"
expect_job truncated_engram_shard "rank 1: .*trunc/model.safetensors: tensor 'layers.0.engram.embed.weight'.*end past the data" 60 \
    mpiexec -n 1 "$DS41" run -m "$big" --prompt-ids 1,2,3 -n 2 --exact : -n 1 "$DS41" run -m "$TMP/trunc" --prompt-ids 1,2,3 -n 2 --exact
rm -f "$TMP/trunc/model.safetensors"
printf '0 0 1\n0 x 1\n' >"$TMP/badmap"
expect_job malformed_expert_map "badmap:2: expected an expert id" 60 \
    mpiexec -n 2 "$DS41" run -m "$tiny" --prompt-ids 1,2,3 -n 2 --expert-map "$TMP/badmap"
printf '0 0 2\n' >"$TMP/rankmap"
expect_job expert_map_rank_out_of_range "rankmap:1: expected a rank (0..1)" 60 \
    mpiexec -n 2 "$DS41" run -m "$tiny" --prompt-ids 1,2,3 -n 2 --expert-map "$TMP/rankmap"

# a rank that stops answering mid-decode (SIGSTOP: hung, or its link gone): rank 0 names it
# within --mpi-timeout (3 s here) and the job ends; then one killed with SIGKILL, and one with
# SIGSEGV: its watcher (dist_watch.c) names the rank, its pid and the signal, and the launcher
# ends the job at once, status non-zero
rank_pid() {   # rank_pid R -> PID of this test's ds41 rank R (empty while not started)
    local p
    for p in $(ours); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = ds41 ] && grep -qzx "PMI_RANK=$1" "/proc/$p/environ" 2>/dev/null && echo "$p"
    done | head -n 1
}
fault_run() {   # fault_run NAME SIGNAL PATTERN LIMIT
    local name=$1 sig=$2 pat=$3 lim=$4
    timeout 120 mpiexec -n 2 "$DS41" run -m "$demo" -p "Once upon a time" -n 3000 -c 4096 --ignore-eos --spec off \
        --mpi-timeout 3 ${FR_ARGS:-} >"$TMP/f.out" 2>"$TMP/f.err" &
    local job=$! p="" i
    for i in $(seq 1 300); do   # until rank 1 decodes (tokens on rank 0's stdout), at most ~30 s
        p=$(rank_pid 1)
        [ -n "$p" ] && [ -s "$TMP/f.out" ] && break
        sleep 0.1
    done
    if [ -z "$p" ]; then fail "$name" "rank 1 never started"; kill "$job" 2>/dev/null; wait "$job"; return; fi
    local t0=$(date +%s.%N)
    kill "-$sig" "$p"
    wait "$job"
    local rc=$? t=$(echo "$(date +%s.%N) - $t0" | bc)
    sleep 0.5
    local left=$(ours | wc -l)
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then fail "$name" "status $rc"; return; fi
    if [ "$(echo "$t > $lim" | bc)" = 1 ]; then fail "$name" "ended ${t}s after the fault (limit ${lim}s)"; return; fi
    if [ "$left" -ne 0 ]; then fail "$name" "$left processes left behind"; return; fi
    if ! grep -q -- "$pat" "$TMP/f.err" "$TMP/f.out"; then fail "$name" "no message matching '$pat': $(tail -c 300 "$TMP/f.err")"; return; fi
    pass "$name"
}
fault_run hung_rank_named STOP "ds41: rank 1 did not answer within 3.0 s" 10
fault_run killed_rank_named KILL "^ds41: rank 1 (pid [0-9]* on .*) was killed by signal 9 (SIGKILL" 10
fault_run crashed_rank_named SEGV "^ds41: rank 1 (pid [0-9]* on .*) was killed by signal 11 (SIGSEGV" 10

# ---------------------------------------------------------------- serve under mpiexec
# (attention replicated; rank 0 serves, rank 1 replays its engine calls): 8 concurrent requests
# (4 streamed; greedy with logprobs, seeded sampling), then the long prompt again (a prefix-cache
# restore on both ranks) give the bytes of one process, exact mode; SIGTERM to rank 0 ends the
# job cleanly (status 0)
serve_port() {   # serve_port LOG -> the HTTP port the server printed (at most ~30 s)
    local i p
    for i in $(seq 1 300); do
        p=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$1" 2>/dev/null)
        [ -n "$p" ] && { echo "$p"; return 0; }
        sleep 0.1
    done
    return 1
}
timeout 120 "$DS41" serve -m "$demo" --port 0 --exact --spec off >/dev/null 2>"$TMP/s1.log" &
s1=$!
timeout 120 mpiexec -n 2 "$DS41" serve -m "$demo" --port 0 --exact --mpi-timeout 10 >/dev/null 2>"$TMP/s2.log" &
s2=$!
if p1=$(serve_port "$TMP/s1.log") && p2=$(serve_port "$TMP/s2.log"); then
    "$PY" tests/serve/mpi_client.py answers "$p1" >"$TMP/s1.out" 2>&1 &
    c1=$!
    "$PY" tests/serve/mpi_client.py answers "$p2" >"$TMP/s2.out" 2>&1
    c2=$?
    wait "$c1"
    c1=$?
    # (serve --split layers below compares with these: hits on whole prompts)
    "$PY" tests/serve/mpi_client.py whole "$p1" >"$TMP/s1w.out" 2>&1 || rm -f "$TMP/s1w.out"
    kill -TERM "$s1" "$(rank_pid 0)" 2>/dev/null
    wait "$s1"
    wait "$s2"
    s2rc=$?
    if [ $c1 -ne 0 ] || [ $c2 -ne 0 ]; then fail serve_n2_answers "a request failed: $(grep -v '^{"' "$TMP/s1.out" "$TMP/s2.out" | head -c 300)"
    elif ! cmp -s "$TMP/s1.out" "$TMP/s2.out"; then fail serve_n2_answers "answers differ from one process: $(cmp "$TMP/s1.out" "$TMP/s2.out")"
    elif [ "$(wc -l <"$TMP/s2.out")" -ne 10 ]; then fail serve_n2_answers "$(wc -l <"$TMP/s2.out") answers, expected 10"
    elif [ $s2rc -ne 0 ]; then fail serve_n2_answers "the job ended with status $s2rc after SIGTERM: $(tail -n 2 "$TMP/s2.log")"
    else pass serve_n2_answers; fi
else
    fail serve_n2_answers "a server did not start: $(tail -n 2 "$TMP/s1.log" "$TMP/s2.log")"
    kill "$s1" "$s2" 2>/dev/null; wait
fi

# a follower that stops answering mid-decode (SIGSTOP: hung) and, below, a link that breaks:
# every request in flight gets an OpenAI-shaped 503 naming rank 1 (the streams an error event),
# rank 0 names it in one line, the job ends non-zero; the answers within --mpi-timeout (2 s)
# plus the 2 s rank 0 gives them plus 1 s.
# Then one killed with SIGKILL: MPICH's launcher kills every rank's process group at once,
# rank 0 included (even with -disable-auto-cleanup); rank 0's 503 guard (a process of its own,
# in a session of its own) answers the requests in flight instead: each of the 8 gets a 503
# saying that the MPI job ended (a stream that had begun: an error event after its tokens), at
# most 5 s after the kill; no hang, status non-zero, and the guard is gone afterwards (at most
# a zombie waiting for init).
serve_fault() {   # serve_fault NAME SIG: SIG sent to rank 1 mid-decode; $SF_LAUNCH: the ranks' launcher
    local name=$1 sig=$2 p target crc rc t0 t left guard q
    rm -f "$TMP/sf.log"   # not the last job's port: the new job's redirect may come late
    timeout 120 $SF_ENV mpiexec -n 2 $SF_LAUNCH "$DS41" serve -m "$PWD/$demo" --port 0 --exact --mpi-timeout 2 $SF_FLAGS \
        >/dev/null 2>"$TMP/sf.log" &
    local job=$!
    if ! p=$(serve_port "$TMP/sf.log") || [ -z "$(rank_pid 1)" ]; then
        fail "$name" "the server did not start: $(tail -n 2 "$TMP/sf.log")"; kill "$job"; wait "$job"; return
    fi
    target=$(rank_pid 1)
    guard=""
    for q in $(ours); do [ "$(cat "/proc/$q/comm" 2>/dev/null)" = ds41-guard ] && guard=$q; done
    if [ -z "$guard" ]; then fail "$name" "rank 0 started no ds41-guard process"; kill "$job"; wait "$job"; return; fi
    case $sig in ip\ *) target=cmd ;; esac   # a shell command (a link down) instead of a signal
    t0=$(date +%s.%N)
    timeout 60 $SF_IN "$PY" tests/serve/mpi_client.py fault "$p" "$target" "$sig" >"$TMP/sf.out" 2>&1
    crc=$?
    wait "$job"
    rc=$? t=$(echo "$(date +%s.%N) - $t0" | bc)
    sleep 0.5
    left=$(ours | wc -l)
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then fail "$name" "status $rc"; return; fi
    if [ "$(echo "$t > 20" | bc)" = 1 ]; then fail "$name" "ended ${t}s after the requests started (limit 20 s)"; return; fi
    if [ "$left" -ne 0 ]; then fail "$name" "$left processes left behind"; return; fi
    if [ -e "/proc/$guard" ] && ! grep -q '^State:.*Z' "/proc/$guard/status" 2>/dev/null; then
        fail "$name" "the guard $guard is still running after the job"; return
    fi
    if [ $crc -ne 0 ]; then fail "$name" "not every request got its 503: $(head -c 400 "$TMP/sf.out")"; return; fi
    if [ "$sig" != KILL ]; then
        t=$(sed -n 's/^last answer \([0-9.]*\) s after the kill/\1/p' "$TMP/sf.out")
        if [ -z "$t" ] || [ "$(echo "$t > 5" | bc)" = 1 ]; then fail "$name" "the 503s came ${t}s after the fault (limit 2 + 2 + 1 s)"; return; fi
        if [ "$(grep -c "rank 1 did not answer" "$TMP/sf.log")" -ne 1 ]; then fail "$name" "rank 0's line: $(tail -n 3 "$TMP/sf.log")"; return; fi
    else
        t=$(sed -n 's/^last answer \([0-9.]*\) s after the kill/\1/p' "$TMP/sf.out")
        if [ -z "$t" ] || [ "$(echo "$t > 5" | bc)" = 1 ]; then fail "$name" "the 503s came ${t}s after the kill (limit 5 s)"; return; fi
    fi
    pass "$name"
}
# ---------------------------------------------------------------- serve --cache-dir under mpiexec
# Rank 0 alone reads and writes the store; the blocks it reads from disk go to rank 1 in the
# record (BLOCKS) before the restore. A job answers the 8 requests and the 2 repeats and stops
# (the store keeps the long prompt's blocks), then a new job with the same --cache-dir answers
# them again: its first long-prompt request restores from disk. Each phase's answers are the
# bytes of one process doing the same with its own --cache-dir (texts, logprobs, usage with
# cached_tokens), the second phase's first request reports cached tokens (a hit from disk, the
# memory cache being new), and rank 0 sent blocks read from its store (DS41_MPI_VERBOSE).
cd_phase() {   # cd_phase TAG: one process and a 2-rank job, one after the other, each on its store
    local tag=$1 p j
    timeout 120 "$DS41" serve -m "$demo" --port 0 --exact --spec off --cache-dir "$TMP/cd1" >/dev/null 2>"$TMP/$tag.one.log" &
    j=$!
    if p=$(serve_port "$TMP/$tag.one.log"); then "$PY" tests/serve/mpi_client.py answers "$p" >"$TMP/$tag.one.out" 2>&1; fi
    kill -TERM "$j" 2>/dev/null; wait "$j"
    DS41_MPI_VERBOSE=1 timeout 120 mpiexec -n 2 "$DS41" serve -m "$demo" --port 0 --exact --mpi-timeout 10 --cache-dir "$TMP/cd2" \
        >/dev/null 2>"$TMP/$tag.mpi.log" &
    j=$!
    if p=$(serve_port "$TMP/$tag.mpi.log"); then "$PY" tests/serve/mpi_client.py answers "$p" >"$TMP/$tag.mpi.out" 2>&1; fi
    kill -TERM "$(rank_pid 0)" 2>/dev/null; wait "$j"
    cd_rc=$?
}
rm -rf "$TMP/cd1" "$TMP/cd2"
cd_phase cdA
cd_phase cdB
first_hit=$(head -n 1 "$TMP/cdB.one.out" 2>/dev/null | sed -n 's/.*"cached_tokens": \([0-9]*\).*/\1/p')
shipped=$(sed -n 's/.*--cache-dir: \([0-9]*\) blocks read from the store sent to the other ranks.*/\1/p' "$TMP/cdB.mpi.log")
if [ "$(wc -l <"$TMP/cdA.mpi.out" 2>/dev/null)" != 10 ] || [ "$(wc -l <"$TMP/cdB.mpi.out" 2>/dev/null)" != 10 ]; then
    fail serve_n2_cache_dir "answers: $(tail -n 3 "$TMP/cdA.mpi.log" "$TMP/cdB.mpi.log" "$TMP/cdB.mpi.out" 2>&1 | head -c 600)"
elif ! cmp -s "$TMP/cdA.one.out" "$TMP/cdA.mpi.out" || ! cmp -s "$TMP/cdB.one.out" "$TMP/cdB.mpi.out"; then
    fail serve_n2_cache_dir "answers differ from one process: $(cmp "$TMP/cdA.one.out" "$TMP/cdA.mpi.out"; cmp "$TMP/cdB.one.out" "$TMP/cdB.mpi.out")"
elif [ -z "$first_hit" ] || [ "$first_hit" -lt 128 ]; then
    fail serve_n2_cache_dir "the restarted servers' first long prompt restored '$first_hit' tokens (expected >= 128, from disk)"
elif [ -z "$shipped" ] || [ "$shipped" -lt 1 ] || [ "$cd_rc" -ne 0 ]; then
    fail serve_n2_cache_dir "rank 0 sent '$shipped' blocks from its store, status $cd_rc: $(tail -n 2 "$TMP/cdB.mpi.log")"
else
    pass serve_n2_cache_dir
fi

SF_ENV="" SF_LAUNCH="" SF_IN="" SF_FLAGS=""
serve_fault serve_hung_rank_503 STOP
serve_fault serve_killed_rank KILL
# a link that breaks mid-decode: each rank in its own namespace (tests/netns.sh), the veth
# taken down under 8 requests; the HTTP client in rank 0's namespace
NS=ds41s$$
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && ip netns add "${NS}0" 2>/dev/null && ip netns add "${NS}1" 2>/dev/null &&
   ip link add "${NS}a" netns "${NS}0" type veth peer name "${NS}b" netns "${NS}1" 2>/dev/null; then
    trap 'ns_cleanup; cleanup' EXIT
    ns_pair_up
    ns_launcher "$TMP/launch"
    SF_ENV="env MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NOLOCAL=1 UCX_TLS=tcp,self" SF_LAUNCH=$TMP/launch SF_IN="ip netns exec ${NS}0"
    serve_fault serve_link_down_503 "ip -n ${NS}0 link set ${NS}a down"
    ns_cleanup
else
    ns_cleanup
    echo "SKIP serve_link_down_503: needs root and ip netns"
fi

# ---------------------------------------------------------------- serve --spec under mpiexec
# rank 0 drafts, verifies and decides each verify's outcome; rank 1 proposes with it (DSpark's
# MoE layers exchange) and keeps rank 0's accepted rows. The 8 concurrent requests and the
# repeat (as above: greedy with logprobs, seeded sampling, whose rejection sampling draws from
# rank 0's stream) give the bytes of one process with the same --spec, exact mode. fixed:3:
# the drafts verified and accepted (rank 0's /metrics) equal the one process's too, and are
# not 0. auto: the job calibrates first (its forwards collective: a CALIBRATE record), into a
# fresh curve file that the one process then loads, so both schedule the drafts from the same
# curve. Two phases of two servers each: (mpiexec auto, one process fixed:3), then (mpiexec
# fixed:3, one process auto).
spec_metrics() {   # spec_metrics PORT -> "draft_tokens accepted_tokens"
    "$PY" -c "
import re, sys, urllib.request
t = urllib.request.urlopen('http://127.0.0.1:%s/metrics' % sys.argv[1], timeout=10).read().decode()
g = lambda n: int(float(re.search(r'^' + n + r'\{[^}]*\} ([0-9.e+]+)$', t, re.M).group(1)))
print(g('vllm:spec_decode_num_draft_tokens_total'), g('vllm:spec_decode_num_accepted_tokens_total'))" "$1"
}
# pair_start TAG "JOB_FLAGS" "ONE_FLAGS": `mpiexec -n 2 ds41 serve` (DS41_MPI_VERBOSE=1) and one
# process on demo, the job first (the one process may load what it wrote: the --spec auto
# curve); their ports in pr_pm, pr_po, or pr_why. pair_clients TAG MODE: mpi_client.py MODE
# against both at once into $TMP/TAG.{mpi,one}.out (pr_why on a failed request). pair_end:
# SIGTERM to both.
pair_start() {
    local tag=$1
    DS41_MPI_VERBOSE=1 timeout 120 mpiexec -n 2 "$DS41" serve -m "$demo" --port 0 --mpi-timeout 10 $2 >/dev/null \
        2>"$TMP/$tag.mpi.log" &
    pr_jm=$!
    pr_why="" pr_po="" pr_pm=""
    pr_pm=$(serve_port "$TMP/$tag.mpi.log") || pr_why="the job did not start: $(tail -n 2 "$TMP/$tag.mpi.log")"
    timeout 120 "$DS41" serve -m "$demo" --port 0 $3 >/dev/null 2>"$TMP/$tag.one.log" &
    pr_jo=$!
    [ -n "$pr_why" ] || pr_po=$(serve_port "$TMP/$tag.one.log") || pr_why="the one process did not start: $(tail -n 2 "$TMP/$tag.one.log")"
}
pair_clients() {
    local tag=$1 mode=$2 cm co
    [ -z "$pr_why" ] || return
    "$PY" tests/serve/mpi_client.py "$mode" "$pr_pm" >"$TMP/$tag.mpi.out" 2>&1 &
    cm=$!
    "$PY" tests/serve/mpi_client.py "$mode" "$pr_po" >"$TMP/$tag.one.out" 2>&1
    co=$?
    wait "$cm"; cm=$?
    [ $cm -eq 0 ] && [ $co -eq 0 ] || pr_why="a request failed: $(grep -v '^{"' "$TMP/$tag.mpi.out" "$TMP/$tag.one.out" | head -c 300)"
}
pair_end() {
    kill -TERM "$pr_jo" "$(rank_pid 0)" 2>/dev/null
    wait "$pr_jo" "$pr_jm"
}
spec_phase() {   # spec_phase TAG MPI_SPEC ONE_SPEC: $TMP/TAG.{mpi,one}.{out,log,met}; $SP_MPI: the job's flags, $SP_KERN: both's kernel mode
    local tag=$1
    export DS41_SPEC_CURVE=$TMP/curve.txt
    pair_start "$tag" "${SP_KERN---exact} --spec $2 ${SP_MPI:-}" "${SP_KERN---exact} --spec $3"
    pair_clients "$tag" answers
    if [ -z "$pr_why" ]; then
        spec_metrics "$pr_pm" >"$TMP/$tag.mpi.met" 2>&1
        spec_metrics "$pr_po" >"$TMP/$tag.one.met" 2>&1
    fi
    # SP_PROC: then the requests with logits processors (TAG.p.{mpi,one}.out) and the grammar
    # requests, each twice in a row (TAG.g.{mpi,one}.out)
    [ -z "${SP_PROC:-}" ] || pair_clients "$tag.p" processed
    [ -z "${SP_PROC:-}" ] || pair_clients "$tag.g" grammars
    [ -z "$pr_why" ] || echo "$pr_why" >"$TMP/$tag.err"
    pair_end
    unset DS41_SPEC_CURVE
}
rm -f "$TMP/curve.txt"
spec_phase specA auto fixed:3
spec_phase specB fixed:3 auto
for x in "fixed:3 specB.mpi specA.one" "auto specA.mpi specB.one"; do
    set -- $x
    name=serve_n2_spec_${1%%:*}
    # replicated: a step's proposals go in one DRAFTS record and every rank runs them in one batched forward
    rb=$(sed -n 's/.*\[rank 1\]: replicated attention: .*--spec: \([0-9]*\) proposals (\([0-9]*\) batched forwards).*/\1 \2/p' "$TMP/$2.log")
    if [ -s "$TMP/specA.err" ] || [ -s "$TMP/specB.err" ]; then fail "$name" "$(cat "$TMP/specA.err" "$TMP/specB.err" 2>/dev/null)"
    elif ! cmp -s "$TMP/$2.out" "$TMP/$3.out"; then fail "$name" "answers differ from one process: $(cmp "$TMP/$2.out" "$TMP/$3.out")"
    elif [ "$(wc -l <"$TMP/$2.out")" -ne 10 ]; then fail "$name" "$(wc -l <"$TMP/$2.out") answers, expected 10"
    elif [ "$1" = auto ] && ! grep -q "measured the verify-width curve" "$TMP/specA.mpi.log"; then
        fail "$name" "the job did not calibrate: $(tail -n 2 "$TMP/specA.mpi.log")"
    elif [ "$1" = fixed:3 ] && { ! cmp -s "$TMP/$2.met" "$TMP/$3.met" || [ "$(cut -d' ' -f2 "$TMP/$2.met")" -lt 1 ]; }; then
        fail "$name" "drafts verified / accepted: '$(cat "$TMP/$2.met")' (one process: '$(cat "$TMP/$3.met")', expected equal, some accepted)"
    elif [ "$1" = fixed:3 ] && { [ -z "$rb" ] || [ "${rb#* }" -lt 1 ] || [ "${rb% *}" -lt $((2 * ${rb#* })) ]; }; then
        fail "$name" "rank 1 ran '$rb' proposals / batched forwards of DRAFTS records (expected at least one, each of 2 or more)"
    else pass "$name ($(cat "$TMP/$2.met") drafts verified / accepted; rank 1: ${rb:-0 0} proposals in batched forwards)"; fi
done

# ---------------------------------------------------------------- serve --spec --dp-attention
# The same two phases under --dp-attention: each owner proposes (the other rank joins its DSpark
# stages' exchanges), verifies and decides its own sequences' drafts with the sequence's sampler
# (seeded sampling's rejection draws from the owner's stream, as one process draws from the
# session's); rank 0 plans the verify blocks from the owner's drafts and confidences and keeps
# the drafting gate's counts. Same bytes as one process with the same --spec (exact mode), the
# same drafts verified / accepted for fixed:3, and rank 1 proposed and verified for the
# sequences it held (DS41_MPI_VERBOSE). auto from a cold curve: the job calibrates (rank 0's
# forwards alone, the other rank joining their exchanges); on this machine the measured curve
# may say that drafting does not pay (no drafts at all), so auto runs once more from a curve
# file in which a verify block of any width costs a plain step: the gate drafts (some accepted,
# rank 1 proposed and verified). auto plans each step's drafts over the rows that share it,
# which depends on when the requests arrived, so its counts are not compared (two one-process
# servers given the same requests counted 321 and 318 drafts); the answers are. Then fast mode,
# fixed:3, against fast in one process.
# The proposals of a step's rows go in one DRAFTS record (each owner proposes its own, the
# ranks' proposals sharing the exchange's rounds): with 8 concurrent requests rank 0 sent some.
# dp_spec_check NAME MPI_TAG ONE_TAG MODE (auto: calibrated; drafts: the drafts counted equal,
# some accepted, rank 1 proposed and verified, DRAFTS records sent; autodrafts: the same but the
# counts not compared)
dp_spec_check() {
    local name=$1 m=$2 o=$3 mode=$4 p1
    p1=$(sed -n 's/.*\[rank 1\]: --dp-attention: .*--spec: \([0-9]*\) proposals ([0-9]* batched forwards), \([0-9]*\) verify blocks.*/\1 \2/p' "$TMP/$m.log")
    b1=$(sed -n 's/.*\[rank 1\]: --dp-attention: .*--spec: [0-9]* proposals (\([0-9]*\) batched forwards).*/\1/p' "$TMP/$m.log")
    dr=$(sed -n 's/.*\[rank 0\]: --dp-attention: .*proposals asked together: \([0-9]*\) DRAFTS records for \([0-9]*\) proposals.*/\1 \2/p' "$TMP/$m.log")
    if [ -s "$TMP/${m%%.*}.err" ] || [ -s "$TMP/${o%%.*}.err" ]; then fail "$name" "$(cat "$TMP/${m%%.*}.err" "$TMP/${o%%.*}.err" 2>/dev/null)"
    elif ! cmp -s "$TMP/$m.out" "$TMP/$o.out"; then fail "$name" "answers differ from one process: $(cmp "$TMP/$m.out" "$TMP/$o.out")"
    elif [ "$(wc -l <"$TMP/$m.out")" -ne 10 ]; then fail "$name" "$(wc -l <"$TMP/$m.out") answers, expected 10"
    elif [ "$mode" = auto ] && ! grep -q "measured the verify-width curve" "$TMP/$m.log"; then
        fail "$name" "the job did not calibrate: $(tail -n 2 "$TMP/$m.log")"
    elif [ "$mode" = drafts ] && { ! cmp -s "$TMP/$m.met" "$TMP/$o.met" || [ "$(cut -d' ' -f2 "$TMP/$m.met")" -lt 1 ]; }; then
        fail "$name" "drafts verified / accepted: '$(cat "$TMP/$m.met")' (one process: '$(cat "$TMP/$o.met")', expected equal, some accepted)"
    elif [ "$mode" = autodrafts ] && [ "$(cut -d' ' -f2 "$TMP/$m.met")" -lt 1 ]; then
        fail "$name" "no drafts accepted: '$(cat "$TMP/$m.met")'"
    elif [ "$mode" != auto ] && { [ -z "$p1" ] || [ "${p1#* }" -lt 1 ] || [ "${p1% *}" -lt 1 ]; }; then
        fail "$name" "rank 1 proposed / verified '$p1' (expected some): $(grep 'rank 1' "$TMP/$m.log" | tail -n 2)"
    elif [ "$mode" != auto ] && { [ -z "$b1" ] || [ "$b1" -lt 1 ] || [ "$b1" -gt "${p1% *}" ]; }; then
        fail "$name" "rank 1 ran its ${p1% *} proposals in '$b1' batched forwards (expected 1 to ${p1% *})"
    elif [ "$mode" = drafts ] && { [ -z "$dr" ] || [ "${dr% *}" -lt 1 ]; }; then
        fail "$name" "rank 0 asked no proposals together (DRAFTS records, proposals: '$dr'; expected some with 8 concurrent requests)"
    else pass "$name ($(cat "$TMP/$m.met") drafts verified / accepted; rank 1: ${p1:-0 0} proposals / verify blocks; DRAFTS records / proposals: ${dr:-0 0})"; fi
}
rm -f "$TMP/curve.txt" "$TMP"/dp[ABCF].err
SP_MPI=--dp-attention SP_PROC=1 spec_phase dpA auto fixed:3
SP_MPI=--dp-attention SP_PROC=1 spec_phase dpB fixed:3 auto
dp_spec_check serve_dp_spec_fixed dpB.mpi dpA.one drafts
# --spec with logits processors under --dp-attention: the 10 requests of `processed` (penalties,
# logit_bias, min_tokens; 2 with a grammar; 2 chat requests with a reasoning budget, whose
# drafts past the budget the owner cuts: ds41_lproc_valid_prefix) after the answers above, on
# both pairs of servers:
# the job with fixed:3 against the one process with fixed:3 (seeded sampling's draws depend on
# the drafts, so the same --spec on both sides). A
# sequence with a processor goes to the least-loaded rank, whose owner decides its verify
# blocks with the processor (LPROC; a grammar's allowed tokens for each row of a block from
# rank 0, VMASK). Same bytes as one process, and rank 1 verified blocks of processed sequences
# (DS41_MPI_VERBOSE: "N verify blocks (M with a logits processor, G with a grammar)").
lpv=$(sed -n 's/.*\[rank 1\]: --dp-attention: .*verify blocks (\([0-9]*\) with a logits processor,.*/\1/p' "$TMP/dpB.mpi.log")
if [ -s "$TMP/dpA.err" ] || [ -s "$TMP/dpB.err" ]; then fail serve_dp_spec_lproc "$(cat "$TMP/dpA.err" "$TMP/dpB.err" 2>/dev/null)"
elif [ "$(wc -l <"$TMP/dpB.p.mpi.out" 2>/dev/null)" != 10 ] || ! cmp -s "$TMP/dpB.p.mpi.out" "$TMP/dpA.p.one.out"; then
    fail serve_dp_spec_lproc "answers differ from one process ($(wc -l <"$TMP/dpB.p.mpi.out" 2>/dev/null) lines, expected 10): $(cmp "$TMP/dpB.p.mpi.out" "$TMP/dpA.p.one.out" 2>&1)"
elif [ -z "$lpv" ] || [ "$lpv" -lt 1 ]; then
    fail serve_dp_spec_lproc "rank 1 verified '$lpv' blocks of sequences with a logits processor (expected some)"
else pass "serve_dp_spec_lproc (rank 1: $lpv verify blocks with a logits processor)"; fi
# --spec with a grammar under --dp-attention: the requests of `grammars` (a JSON schema greedy
# with logprobs, a regex with seeded sampling, a forced tool call), each twice in a row, which
# the idle job gives to the two ranks in turn: the owner verifies each block with the allowed
# tokens rank 0 sends for its rows (VMASK: the grammar after the drafts before each row). Same
# bytes as one process with the same --spec (fixed:3 and auto), rank 1 verified blocks of
# grammar sequences, and rank 0 sent their masks (DS41_MPI_VERBOSE: "G with a grammar",
# "verify masks sent: N blocks, R rows restricted").
gv=$(sed -n 's/.*\[rank 1\]: --dp-attention: .*verify blocks ([0-9]* with a logits processor, \([0-9]*\) with a grammar).*/\1/p' "$TMP/dpB.mpi.log")
vm=$(sed -n 's/.*\[rank 0\]: --dp-attention: .*verify masks sent: \([0-9]*\) blocks, \([0-9]*\) rows restricted.*/\1 \2/p' "$TMP/dpB.mpi.log")
if [ -s "$TMP/dpA.err" ] || [ -s "$TMP/dpB.err" ]; then fail serve_dp_spec_grammar "$(cat "$TMP/dpA.err" "$TMP/dpB.err" 2>/dev/null)"
elif [ "$(wc -l <"$TMP/dpB.g.mpi.out" 2>/dev/null)" != 6 ] || ! cmp -s "$TMP/dpB.g.mpi.out" "$TMP/dpA.g.one.out"; then
    fail serve_dp_spec_grammar "fixed:3 answers differ from one process: $(cmp "$TMP/dpB.g.mpi.out" "$TMP/dpA.g.one.out" 2>&1)"
elif [ "$(wc -l <"$TMP/dpA.g.mpi.out" 2>/dev/null)" != 6 ] || ! cmp -s "$TMP/dpA.g.mpi.out" "$TMP/dpB.g.one.out"; then
    fail serve_dp_spec_grammar "auto answers differ from one process: $(cmp "$TMP/dpA.g.mpi.out" "$TMP/dpB.g.one.out" 2>&1)"
elif [ -z "$gv" ] || [ "$gv" -lt 1 ] || [ -z "$vm" ] || [ "${vm% *}" -lt 1 ] || [ "${vm#* }" -lt 1 ]; then
    fail serve_dp_spec_grammar "rank 1 verified '$gv' blocks with a grammar, rank 0 sent '$vm' verify masks (blocks, rows; expected some)"
else pass "serve_dp_spec_grammar (rank 1: $gv verify blocks with a grammar; rank 0: ${vm% *} VMASK records, ${vm#* } rows restricted)"; fi
dp_spec_check serve_dp_spec_auto dpA.mpi dpB.one auto
printf '1 400\n2 400\n3 400\n4 400\n5 400\n6 400\npropose_s 0.0001\ndraft_s 0.00001\n' >"$TMP/curve.txt"
SP_MPI=--dp-attention spec_phase dpC auto auto
dp_spec_check serve_dp_spec_auto_drafting dpC.mpi dpC.one autodrafts
SP_MPI=--dp-attention SP_KERN= spec_phase dpF fixed:3 fixed:3
dp_spec_check serve_dp_spec_fixed_fast dpF.mpi dpF.one drafts

# ---------------------------------------------------------------- images under mpiexec serve
# rank 0 encodes each image and sends the prompt's image positions, content keys and rows (an
# IMAGES record) after the sequence's OPEN; the prompt prefills in the batched steps, and the
# rank that holds the sequence (every rank replicated; with --dp-attention its owner) feeds the
# same rows. tinyvl (tests/vision.test.sh's checkpoint and config, the tiny tokenizer): a PNG
# and a JPEG data URL with a question long enough for a whole prefix-cache block, two
# concurrent greedy requests with logprobs, then the PNG again: a prefix-cache hit (keyed on
# the image's content on the rank that holds it; under --dp-attention PROBE_IMG routes it to
# the rank whose cache holds the block) whose rows come from the image cache, no tower.
# Exact mode: replicated and --dp-attention give the bytes of one process (text, logprobs at
# 17 digits, usage with the cached tokens), the repeat has 128 cached tokens, the PNG and the
# JPEG answer differently (the embeddings reach rank 1's model too), /metrics counts 2 images
# encoded and 1 reused, and under --dp-attention both ranks held an image sequence. Under
# --split layers the two cold answers equal one process's.
VCK=$CK/conf-tinyvl-vision
[ -f "$VCK/.complete" ] && cmp -s "$VCK/config.json" tests/configs/tinyvl/config.json || {
    VCK=$TMP/vlck   # not the shared cache: tests/vision.test.sh may be writing it
    "$PY" tools/make_checkpoint.py tests/configs/tinyvl "$VCK" --seed 1 --token-map stub --vision -q >"$TMP/vl.log" 2>&1; }
FCK=$TMP/vlfile
vl_files "$VCK" "$FCK"
cat >"$TMP/vimg.py" <<'PYEOF'
import base64, io, json, re, sys, threading, urllib.request
from PIL import Image, ImageDraw
a = Image.new("RGB", (150, 100), (20, 200, 40)); ImageDraw.Draw(a).ellipse((30, 20, 90, 80), fill=(220, 30, 30))
b = Image.new("RGB", (90, 120), (0, 0, 250)); ImageDraw.Draw(b).rectangle((10, 10, 50, 70), fill=(250, 250, 0))
urls = []
for im, fmt, mime in ((a, "PNG", "image/png"), (b, "JPEG", "image/jpeg")):
    f = io.BytesIO(); im.save(f, fmt); urls.append("data:%s;base64,%s" % (mime, base64.b64encode(f.getvalue()).decode()))
q = "Look at the picture above, then say which colour the largest shape in it has, and where it sits. " * 3
out = [None, None, None]
def ask(i, u):
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": urls[u]}},
                                                      {"type": "text", "text": q}]}],
            "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 2, "skip_special_tokens": False}
    rq = urllib.request.Request("http://127.0.0.1:%s/v1/chat/completions" % sys.argv[1], json.dumps(body).encode(),
                                {"Content-Type": "application/json"})
    with urllib.request.urlopen(rq, timeout=60) as r: d = json.loads(r.read())
    out[i] = json.dumps({"choices": d["choices"], "usage": d["usage"]}, sort_keys=True)
ts = [threading.Thread(target=ask, args=(i, i)) for i in (0, 1)]
for t in ts: t.start()
for t in ts: t.join()
ask(2, 0)
t = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=30).read().decode()
m = [re.search(r"^ds41:images_%s_total\{[^}]*\} (\S+)" % n, t, re.M) for n in ("encoded", "reused")]
print("\n".join(o or "no answer" for o in out))
print("images encoded %s reused %s" % tuple(str(int(float(x.group(1)))) if x else "-" for x in m))
PYEOF
vcheck() {   # NAME OUT: three answers equal to one process's, the repeat a hit, the counters
    local name=$1 out=$2
    if [ "$(grep -c '"usage"' "$TMP/v1.out")" -ne 3 ]; then fail "$name" "one process: $(head -c 300 "$TMP/v1.out")"
    elif ! cmp -s "$TMP/v1.out" "$out"; then fail "$name" "answers differ from one process: $(head -c 300 "$out")"
    elif "$PY" -c "import json,sys; a,b=[json.loads(l)['choices'][0]['message']['content'] for l in list(open(sys.argv[1]))[:2]]; sys.exit(a != b)" \
         "$out"; then fail "$name" "the PNG and the JPEG answer alike"
    elif ! "$PY" -c "import json,sys; l=list(open(sys.argv[1])); sys.exit(json.loads(l[2])['usage']['prompt_tokens_details']['cached_tokens'] != 128)" \
         "$out"; then fail "$name" "the repeated image was not a prefix-cache hit of one block: $(sed -n 3p "$out" | head -c 300)"
    elif [ "$(tail -n 1 "$out")" != "images encoded 2 reused 1" ]; then fail "$name" "image cache: $(tail -n 1 "$out") (expected 2 encoded, 1 reused)"
    else pass "$name"; fi
}
vjob() {   # vjob NAME FLAGS...: `mpiexec -n 2 ds41 serve` on FCK (exact) with FLAGS, vimg.py's
    # answers in $TMP/NAME.out, its log $TMP/NAME.log; status 1 when it did not start
    local name=$1 job p; shift
    DS41_MPI_VERBOSE=1 timeout 180 mpiexec -n 2 "$DS41" serve -m "$FCK" --port 0 --exact -c 512 --mpi-timeout 10 "$@" \
        >/dev/null 2>"$TMP/$name.log" &
    job=$!
    if ! p=$(serve_port "$TMP/$name.log"); then
        fail "$name" "the server did not start: $(tail -n 2 "$TMP/$name.log")"
        kill "$job" 2>/dev/null; wait "$job"; return 1
    fi
    "$PY" "$TMP/vimg.py" "$p" >"$TMP/$name.out" 2>&1
    kill -TERM "$(rank_pid 0)" 2>/dev/null
    wait "$job"
}
timeout 180 "$DS41" serve -m "$FCK" --port 0 --exact --spec off -c 512 >/dev/null 2>"$TMP/v1.log" &
v1=$!
if p1=$(serve_port "$TMP/v1.log"); then
    "$PY" "$TMP/vimg.py" "$p1" >"$TMP/v1.out" 2>&1
    kill -TERM "$v1" 2>/dev/null
    wait "$v1"
    vjob serve_n2_images && vcheck serve_n2_images "$TMP/serve_n2_images.out"
    if vjob serve_dp_images --dp-attention; then
        vcheck serve_dp_images "$TMP/serve_dp_images.out"
        h0=$(sed -n 's/.*\[rank 0\]: --dp-attention: \([0-9]*\) sequences held here.*/\1/p' "$TMP/serve_dp_images.log")
        h1=$(sed -n 's/.*\[rank 1\]: --dp-attention: \([0-9]*\) sequences held here.*/\1/p' "$TMP/serve_dp_images.log")
        if [ -z "$h0" ] || [ -z "$h1" ] || [ "$h0" -lt 1 ] || [ "$h1" -lt 1 ] || [ $((h0 + h1)) -ne 3 ]; then
            fail serve_dp_images_owners "image sequences held by rank 0 / 1: '$h0' / '$h1' (expected both, 3 in all)"
        else pass serve_dp_images_owners; fi
    fi
    # --split layers (no prefix cache there): the stage ranks keep the IMAGES rows too, the
    # first stage embeds them; the two concurrent cold answers are the one process's bytes
    if vjob serve_split_images --spec off --split layers; then
        o=$TMP/serve_split_images.out
        if [ "$(head -n 2 "$o")" = "$(head -n 2 "$TMP/v1.out")" ] && [ "$(grep -c '"usage"' "$o")" -eq 3 ]; then
            pass serve_split_images
        else fail serve_split_images "answers differ from one process: $(head -c 300 "$o")"; fi
    fi
else
    fail serve_n2_images "the one-process server did not start: $(tail -n 2 "$TMP/v1.log")"
    kill "$v1" 2>/dev/null; wait "$v1"
fi

# ---------------------------------------------------------------- serve --dp-attention
# job_answers LOG OUT FLAGS...: `mpiexec -n 2 ds41 serve` on demo (exact) with FLAGS and
# DS41_MPI_VERBOSE=1: the client's answers (the repeats restored from the prefix cache) into
# OUT, /metrics after them into OUT.metrics, then the whole-block prompts' answers into
# OUT.whole; SIGTERM to rank 0; ja_c: the clients' status, ja_rc: the job's ("start" when it
# did not start)
metrics() {   # metrics PORT -> the server's /metrics text
    "$PY" -c 'import sys, urllib.request; print(urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1]).read().decode())' \
        "$1" 2>&1
}
job_answers() {
    local log=$1 out=$2 job p; shift 2
    DS41_MPI_VERBOSE=1 timeout 120 mpiexec -n 2 "$DS41" serve -m "$demo" --port 0 --exact --mpi-timeout 10 "$@" \
        >/dev/null 2>"$log" &
    job=$!
    if ! p=$(serve_port "$log"); then ja_rc=start; kill "$job" 2>/dev/null; wait "$job"; return; fi
    "$PY" tests/serve/mpi_client.py answers "$p" >"$out" 2>&1
    ja_c=$?
    metrics "$p" >"$out.metrics"   # (the answers' hits only)
    "$PY" tests/serve/mpi_client.py whole "$p" >"$out.whole" 2>&1 || ja_c=1
    kill -TERM "$(rank_pid 0)" 2>/dev/null
    wait "$job"
    ja_rc=$?
}
# hits_agree OUT: /metrics' prefix-cache hits (OUT.metrics) equal the answers' cached_tokens
# and cover the two repeats' whole blocks (>= 256); prints why not, nothing when they do
hits_agree() {
    local mh ch
    mh=$(sed -n 's/^vllm:prefix_cache_hits{[^}]*} \([0-9]*\).*/\1/p' "$1.metrics")
    ch=$(grep -o '"cached_tokens": [0-9]*' "$1" | awk '{ s += $2 } END { print s + 0 }')
    if [ -z "$mh" ] || [ "$mh" != "$ch" ] || [ "$ch" -lt 256 ]; then
        echo "/metrics counts '$mh' prefix-cache hits, the answers $ch cached tokens (expected equal, >= 256)"
    fi
}
# Each rank holds and attends its own sequences (rank 0 gives each new one to the rank whose
# prefix cache holds the longest prefix of its prompt, then the least-loaded); rows travel to
# their experts' owners and back. The 8 concurrent requests and the 2 repeats give the bytes of
# one process (exact mode): the one-process answers above, the repeats' prefix-cache hits
# included (restored on the rank that held the long prompt), and /metrics counts those hits.
# Then one seeded request twice in a row: the idle server gives them to the two ranks in turn,
# so one is sampled on rank 0 and one on its owner (which sends rank 0 the token, not the
# logits: the DS41_MPI_VERBOSE count of rows answered with a token); both answers are equal;
# the same for a request with a JSON grammar, whose owner sends the logits row (the count of
# rows answered with logits). The Engram tables are sharded by rows (rank 1 holds the upper
# half; each forward asks the other rank for its rows). Both ranks held sequences (14 in all); SIGTERM ends the job with status 0. Then the faults of
# replicated serve: a hung rank gets every request its 503 naming rank 1, a killed one ends the
# job at once.
if [ -s "$TMP/s1.out" ]; then
    rm -rf "$TMP/dpcd"
    DS41_MPI_VERBOSE=1 timeout 120 mpiexec -n 2 "$DS41" serve -m "$demo" --port 0 --exact --mpi-timeout 10 --dp-attention \
        --cache-dir "$TMP/dpcd" >/dev/null 2>"$TMP/s3.log" &
    s3=$!
    if p3=$(serve_port "$TMP/s3.log"); then
        "$PY" tests/serve/mpi_client.py answers "$p3" >"$TMP/s3.out" 2>&1
        c3=$?
        metrics "$p3" >"$TMP/s3.out.metrics"
        "$PY" tests/serve/mpi_client.py twice "$p3" >"$TMP/s3t.out" 2>&1
        c3t=$?
        kill -TERM "$(rank_pid 0)" 2>/dev/null
        wait "$s3"
        s3rc=$?
        h0=$(sed -n 's/.*\[rank 0\]: --dp-attention: \([0-9]*\) sequences held here.*/\1/p' "$TMP/s3.log")
        h1=$(sed -n 's/.*\[rank 1\]: --dp-attention: \([0-9]*\) sequences held here.*/\1/p' "$TMP/s3.log")
        tok=$(sed -n 's/.* \([0-9]*\) rows with a token, \([0-9]*\) with logits; grammar masks sent: \([0-9]*\).*/\1 \2 \3/p' "$TMP/s3.log")
        hits=$(hits_agree "$TMP/s3.out")
        if [ $c3 -ne 0 ]; then fail serve_dp_answers "a request failed: $(grep -v '^{"' "$TMP/s3.out" | head -c 300)"
        elif ! cmp -s "$TMP/s1.out" "$TMP/s3.out"; then fail serve_dp_answers "answers differ from one process: $(cmp "$TMP/s1.out" "$TMP/s3.out")"
        elif [ -n "$hits" ]; then fail serve_dp_answers "$hits"
        elif [ $c3t -ne 0 ]; then fail serve_dp_answers "a seeded request sampled on rank 0 and on its owner: $(head -c 600 "$TMP/s3t.out")"
        elif [ -z "$tok" ] || [ "$(echo "$tok" | cut -d' ' -f1)" -lt 1 ] || [ "$(echo "$tok" | cut -d' ' -f2)" -ne 0 ] ||
             [ "$(echo "$tok" | cut -d' ' -f3)" -lt 1 ]; then
            fail serve_dp_answers "rows answered with a token / with logits / grammar masks sent: '$tok' (expected some / 0 / some)"
        elif [ $s3rc -ne 0 ]; then fail serve_dp_answers "the job ended with status $s3rc after SIGTERM: $(tail -n 2 "$TMP/s3.log")"
        elif ! grep -q '\[rank 1\]: engram: rows [1-9][0-9]*\.\.[0-9]* of [0-9]*, .*exchange: [1-9][0-9]* steps, [1-9]' "$TMP/s3.log"; then
            fail serve_dp_answers "rank 1 did not hold a share of the Engram rows or exchange any: $(grep 'engram: rows' "$TMP/s3.log" | head -c 300)"
        elif [ -z "$h0" ] || [ -z "$h1" ] || [ "$h0" -lt 1 ] || [ "$h1" -lt 1 ] || [ $((h0 + h1)) -ne 14 ]; then
            fail serve_dp_answers "sequences held by rank 0 / 1: '$h0' / '$h1' (expected both, 14 in all)"
        else pass serve_dp_answers; fi
    else
        fail serve_dp_answers "the server did not start: $(tail -n 2 "$TMP/s3.log")"
    fi
    SF_ENV="" SF_LAUNCH="" SF_IN="" SF_FLAGS=--dp-attention
    serve_fault serve_dp_hung_rank_503 STOP
    serve_fault serve_dp_killed_rank KILL
    # --engram-mode prefetch under --dp-attention, -n 3: each rank reads its own share of the
    # rows with the engine's I/O (io_uring, or pread where it is missing), for its own forwards
    # and for the rows the other ranks ask for; the same 10 requests give the one process's
    # bytes (its default mode: every mode reads the table's bytes), and each rank's
    # DS41_MPI_VERBOSE line shows rows read from the files and rows looked up for the others.
    # No row cache: every row asked is read while the asked rank's own forward runs, and its
    # answer goes out when the reads are in or waits for them at its first Engram layer (the
    # line counts which; which one depends on the disk, so it is shown, not checked).
    DS41_MPI_VERBOSE=1 timeout 120 mpiexec -n 3 "$DS41" serve -m "$demo" --port 0 --exact --mpi-timeout 10 --dp-attention \
        --engram-mode prefetch --engram-cache off --cache-dir "$TMP/dpcd" >/dev/null 2>"$TMP/s4.log" &
    s4=$!
    if p4=$(serve_port "$TMP/s4.log"); then
        "$PY" tests/serve/mpi_client.py answers "$p4" >"$TMP/s4.out" 2>&1
        c4=$?
        kill -TERM "$(rank_pid 0)" 2>/dev/null
        wait "$s4"
        s4rc=$?
        pf=$("$PY" -c '
import re, sys
pat = (r"ds41(?: \[rank (\d+)\])?: engram: rows .*? \(\d+ bytes, prefetch\);.*; prefetch: (\d+) rows read from the files \((io_uring|pread)\), "
       r"(\d+) rows looked up for other ranks \(its forwards\x27 rounds answered: (\d+) at the keys, (\d+) later with the reads in, (\d+) after")
print(" ".join("%s:%s:%s:%s/%s/%s" % (m.group(1) or 0, m.group(2), m.group(4), m.group(5), m.group(6), m.group(7))
               for m in re.finditer(pat, open(sys.argv[1]).read())))' "$TMP/s4.log")
        ok=$(echo "$pf" | awk '{ n = 0; for (i = 1; i <= NF; i++) { split($i, f, ":"); if (f[2] > 0 && f[3] > 0) n++ } print n }')
        if [ $c4 -ne 0 ]; then fail serve_dp_engram_prefetch "a request failed: $(grep -v '^{"' "$TMP/s4.out" | head -c 300)"
        elif ! cmp -s "$TMP/cdB.one.out" "$TMP/s4.out"; then fail serve_dp_engram_prefetch "answers differ from one process: $(cmp "$TMP/cdB.one.out" "$TMP/s4.out")"
        elif [ "$ok" != 3 ]; then fail serve_dp_engram_prefetch "rank:rows read:looked up for the other ranks '$pf' (expected all 3 ranks > 0): $(grep 'engram: rows' "$TMP/s4.log" | head -c 400)"
        elif [ $s4rc -ne 0 ]; then fail serve_dp_engram_prefetch "the job ended with status $s4rc after SIGTERM: $(tail -n 2 "$TMP/s4.log")"
        else pass "serve_dp_engram_prefetch (-n 3; rank:rows read:looked up for the other ranks:its forwards' rounds answered at the keys/later/after waiting $pf)"; fi
        # --cache-dir under --dp-attention (s3 then s4 on the same stores, DIR/rank-R), restarted
        # with another rank count (s3 -n 2, s4 -n 3): s4's answers are those of one process
        # restarted on its store (cdB.one.out above, the same requests before), its first long
        # prompt restored from disk on the rank whose store holds it (rank 0's PROBE counts
        # memory and disk blocks; ranks 0 and 1 read their own stores, written under -n 2),
        # those stores are rank-R's, and the new rank 2 began a store of its own
        dh=$(head -n 1 "$TMP/s4.out" | sed -n 's/.*"cached_tokens": \([0-9]*\).*/\1/p')
        held=""
        for r in 0 1 2; do
            [ -n "$(find "$TMP/dpcd/rank-$r" -type f -size +1k 2>/dev/null | head -n 1)" ] && held="$held $r"
        done
        if ! cmp -s "$TMP/cdB.one.out" "$TMP/s4.out"; then fail serve_dp_cache_dir "answers differ from one process on its store: $(cmp "$TMP/cdB.one.out" "$TMP/s4.out")"
        elif [ -z "$dh" ] || [ "$dh" -lt 128 ]; then fail serve_dp_cache_dir "the restarted job's first long prompt restored '$dh' tokens (expected >= 128, from disk)"
        elif [ -z "$held" ] || [ -n "$(find "$TMP/dpcd" -maxdepth 1 -type f | head -n 1)" ]; then fail serve_dp_cache_dir "stores with blocks: '$held' under $TMP/dpcd (expected rank-R only)"
        elif [ ! -d "$TMP/dpcd/rank-2" ]; then fail serve_dp_cache_dir "the restart under -n 3 made no store for rank 2: $(ls "$TMP/dpcd")"
        else pass "serve_dp_cache_dir (-n 2 then -n 3; ranks whose store holds blocks:$held)"; fi
    else
        fail serve_dp_engram_prefetch "the server did not start: $(tail -n 2 "$TMP/s4.log")"
        kill "$s4" 2>/dev/null; wait "$s4"
    fi
    # Owner-side sampling with logits processors: 6 concurrent requests with logit_bias,
    # frequency / presence / repetition penalties and min_tokens (greedy with logprobs and
    # seeded sampling) give a one-process server's bytes under -n 2 --dp-attention; their owner
    # samples them (LPROC: the settings and the prompt's ids once, the counts kept from the
    # tokens it draws), so rank 0 gets no logits row for any of them (DS41_MPI_VERBOSE: rows
    # answered with a token, none with logits).
    # The job also restarts the --cache-dir stores of s3/s4 with fewer ranks: they are arranged
    # as a -n 4 job would have left them, the long prompt's blocks in the stores of ranks 2 and
    # 3 only (rank-0's moved to rank-2, rank-1's to rank-3), plus a damaged block file in
    # rank-2. At start ranks 0 and 1 take the stores of ranks 2 and 3 (X mod 2) and move their
    # blocks into their own; the processed prompts are too short for a whole block (no hit
    # either side), then the answers client (s5a) gives the bytes of one process restarted on
    # its store (cdB.one.out: the first long prompt 128 cached tokens, here from the moved
    # blocks), rank 0 says how many blocks moved and names the damaged file left in rank-2.
    fp=""
    if [ -d "$TMP/dpcd/rank-1" ] && [ -d "$TMP/dpcd/rank-2" ]; then
        fp=$(ls "$TMP/dpcd/rank-0" | grep -E '^[0-9a-f]{64}$' | head -n 1)
        rm -rf "$TMP/dpcd/rank-3"
        mv "$TMP/dpcd/rank-1" "$TMP/dpcd/rank-3"
        mv "$TMP/dpcd/rank-0" "$TMP/dpcd/rank-x" && mv "$TMP/dpcd/rank-2" "$TMP/dpcd/rank-0" &&
            mv "$TMP/dpcd/rank-x" "$TMP/dpcd/rank-2"
        [ -n "$fp" ] && printf 'not a block' >"$TMP/dpcd/rank-2/$fp/00000000000000000000000000000000.blk"
    fi
    pair_start s5 "--exact --dp-attention --cache-dir $TMP/dpcd" --exact
    pair_clients s5 processed
    [ -n "$pr_why" ] || "$PY" tests/serve/mpi_client.py answers "$pr_pm" >"$TMP/s5a.out" 2>&1
    pair_end
    moved=$(sed -n 's/^ds41: prefix cache: \([0-9]*\) blocks ([0-9]* bytes) of the stores of ranks past this job.s 2 moved.*/\1/p' "$TMP/s5.mpi.log")
    sh=$(head -n 1 "$TMP/s5a.out" 2>/dev/null | sed -n 's/.*"cached_tokens": \([0-9]*\).*/\1/p')
    left=$(find "$TMP/dpcd/rank-2" "$TMP/dpcd/rank-3" -name '*.blk' 2>/dev/null | wc -l)
    if [ -z "$fp" ]; then fail serve_dp_cache_dir_shrink "no stores of s3/s4 to restart: $(ls "$TMP/dpcd" 2>&1)"
    elif [ -n "$pr_why" ]; then fail serve_dp_cache_dir_shrink "$pr_why"
    elif ! cmp -s "$TMP/cdB.one.out" "$TMP/s5a.out"; then
        fail serve_dp_cache_dir_shrink "answers differ from one process on its store: $(cmp "$TMP/cdB.one.out" "$TMP/s5a.out")"
    elif [ -z "$sh" ] || [ "$sh" -lt 128 ]; then fail serve_dp_cache_dir_shrink "the first long prompt restored '$sh' tokens (expected >= 128, moved blocks)"
    elif [ -z "$moved" ] || [ "$moved" -lt 1 ]; then fail serve_dp_cache_dir_shrink "blocks moved: '$moved': $(grep 'prefix cache' "$TMP/s5.mpi.log" | head -c 400)"
    elif [ "$left" != 1 ] || ! grep -q "rank-2 (the store of rank 2, past this job's 2 ranks) still holds 1 block files .*: not read" "$TMP/s5.mpi.log"; then
        fail serve_dp_cache_dir_shrink "block files left in rank-2/3: $left (expected the damaged one, named): $(grep 'prefix cache' "$TMP/s5.mpi.log" | head -c 400)"
    else pass "serve_dp_cache_dir_shrink (-n 4 stores restarted under -n 2: $moved blocks moved, $sh tokens restored)"; fi
    rows=$(sed -n 's/.*\[rank 0\]: --dp-attention: .*their answers: [0-9]* bytes, \([0-9]*\) rows with a token, \([0-9]*\) with logits; grammar masks sent: \([0-9]*\) .*/\1 \2 \3/p' "$TMP/s5.mpi.log")
    if [ -n "$pr_why" ]; then fail serve_dp_owner_lproc "$pr_why"
    elif ! cmp -s "$TMP/s5.one.out" "$TMP/s5.mpi.out"; then fail serve_dp_owner_lproc "answers differ from one process: $(cmp "$TMP/s5.one.out" "$TMP/s5.mpi.out")"
    elif [ -z "$rows" ] || [ "$(echo "$rows" | cut -d' ' -f1)" -lt 1 ] || [ "$(echo "$rows" | cut -d' ' -f2)" -ne 0 ]; then
        # (the masks sent depend on which rank the 2 grammar requests went to: not asserted here,
        # serve_dp_answers' grammar pair lands on both ranks)
        fail serve_dp_owner_lproc "rows answered with a token / with logits / grammar masks sent: '$rows' (expected some / 0 / any)"
    else pass "serve_dp_owner_lproc (rows answered with a token / logits: $rows)"; fi
else
    fail serve_dp_answers "no answers of one process to compare with"
fi

# ---------------------------------------------------------------- serve --split layers
# Rank 0 runs the first stage (layers 0-4) and the scheduler, rank 1 the last (5-7) and the
# head (--split layers:0-4,5-7: the last stage starts at layer 5, not a KV source, so source 4's
# new entries, its top-k lists and its candidate pool cross with the stream, and rank 1 keeps a
# replica of source 4's pages, which its prefix cache publishes and restores too); each step's items go through the stages in micro-batches, rank 0 running the next
# micro-batch's stage while rank 1 runs the one before, and the logits come back to rank 0
# only. The prefix cache is on: each stage's cache keeps its layers' part of every block (the
# same blocks on every rank: the same records in the same order, each block counted at its
# whole size), so the 2 repeats are restored on both stages. The 8 concurrent requests and the
# 2 repeats give the bytes of one process (exact mode), cached_tokens included, and so do the
# prompts of whole blocks (mpi_client.py whole: 256 ids twice, then their first 200: hits of
# 256 tokens, whose replay gives the last row's logits, and of 128); /metrics counts the hits.
# Rank 0 had the first stage of at least 2 forwards done before their logits came back, and
# its scheduler began a step before it collected the one before (its "pipe:" line: pipelined
# steps, the most forwards in flight, the steps overlapped), i.e. the stages overlapped within
# a step and across steps. SIGTERM ends the job with status 0; a hung stage gets every
# request its 503 naming rank 1, a killed one ends the job at once (the guard answering every
# request).
if [ -s "$TMP/s1.out" ]; then
    job_answers "$TMP/s4.log" "$TMP/s4.out" --split layers:0-4,5-7 --cache-dir "$TMP/spcd"
    if [ "$ja_rc" != start ]; then
        c4=$ja_c s4rc=$ja_rc
        side=$(sed -n 's/.*pipe: layers 5\.\.7 of 8 + head;.*stream received [0-9]* hops [0-9]* rows [0-9]* bytes (\([0-9]*\) beside the stream.*/\1/p' "$TMP/s4.log")
        fl=$(sed -n 's/.*pipe: layers 0\.\.4 of 8 + embedding;.*pipelined serve steps \([0-9]*\), at most \([0-9]*\) forwards in flight, \([0-9]*\) steps overlapped.*/\1 \2 \3/p' "$TMP/s4.log")
        hits=$(hits_agree "$TMP/s4.out")
        if [ $c4 -ne 0 ]; then fail serve_split_answers "a request failed: $(grep -v '^{"' "$TMP/s4.out" | head -c 300)"
        elif ! cmp -s "$TMP/s1.out" "$TMP/s4.out"; then fail serve_split_answers "answers differ from one process: $(cmp "$TMP/s1.out" "$TMP/s4.out")"
        elif [ ! -s "$TMP/s1w.out" ] || ! cmp -s "$TMP/s1w.out" "$TMP/s4.out.whole"; then
            fail serve_split_answers "whole-block prompts differ from one process: $(head -c 300 "$TMP/s4.out.whole")"
        elif [ -n "$hits" ]; then fail serve_split_answers "$hits"
        elif [ -z "$side" ] || [ "$side" -le 0 ]; then fail serve_split_answers "rank 1 received '$side' bytes beside the stream (expected some): $(grep pipe: "$TMP/s4.log")"
        elif [ $s4rc -ne 0 ]; then fail serve_split_answers "the job ended with status $s4rc after SIGTERM: $(tail -n 2 "$TMP/s4.log")"
        elif ! set -- $fl || [ $# -ne 3 ] || [ "$1" -lt 1 ] || [ "$2" -lt 2 ] || [ "$3" -lt 1 ]; then
            fail serve_split_answers "rank 0's steps / forwards in flight / steps overlapped: '$fl' (expected at least 1 / 2 / 1): $(grep pipe: "$TMP/s4.log")"
        else pass serve_split_answers; fi
    else
        fail serve_split_answers "the server did not start: $(tail -n 2 "$TMP/s4.log")"
    fi
    # --cache-dir under --split layers: the job above wrote each stage's part of the blocks to its
    # store (DIR/rank-R); restarted on them, a job answers the 8 requests and the 2 repeats with
    # the bytes of one process restarted on its store (cdB.one of serve_n2_cache_dir: the first
    # long prompt 128 cached tokens, from disk; every stage restored the blocks every stage held)
    timeout 120 mpiexec -n 2 "$DS41" serve -m "$demo" --port 0 --exact --mpi-timeout 10 --split layers:0-4,5-7 --cache-dir "$TMP/spcd" \
        >/dev/null 2>"$TMP/s4b.log" &
    j=$!
    if p=$(serve_port "$TMP/s4b.log"); then "$PY" tests/serve/mpi_client.py answers "$p" >"$TMP/s4b.out" 2>&1; fi
    kill -TERM "$(rank_pid 0)" 2>/dev/null; wait "$j"
    sdh=$(head -n 1 "$TMP/s4b.out" 2>/dev/null | sed -n 's/.*"cached_tokens": \([0-9]*\).*/\1/p')
    if [ ! -s "$TMP/cdB.one.out" ]; then fail serve_split_cache_dir "no answers of one process restarted on its store to compare with"
    elif ! cmp -s "$TMP/cdB.one.out" "$TMP/s4b.out"; then fail serve_split_cache_dir "answers differ from one process on its store: $(cmp "$TMP/cdB.one.out" "$TMP/s4b.out"; grep -v '^{"' "$TMP/s4b.out" | head -c 300)"
    elif [ -z "$sdh" ] || [ "$sdh" -lt 128 ]; then fail serve_split_cache_dir "the restarted job's first long prompt restored '$sdh' tokens (expected >= 128, from disk)"
    elif [ -z "$(find "$TMP/spcd/rank-0" -name '*.blk' 2>/dev/null)" ] || [ -z "$(find "$TMP/spcd/rank-1" -name '*.blk' 2>/dev/null)" ]; then
        fail serve_split_cache_dir "a stage's store holds no blocks: $(find "$TMP/spcd" -name '*.blk' | head -c 300)"
    else pass serve_split_cache_dir; fi
    SF_ENV="" SF_LAUNCH="" SF_IN="" SF_FLAGS="--split layers"
    serve_fault serve_split_hung_stage_503 STOP
    serve_fault serve_split_killed_stage KILL
else
    fail serve_split_answers "no answers of one process to compare with"
fi
# serve --split layers --spec fixed:3: the last stage proposes (every DSpark target layer sits on
# it) and answers rank 0's DRAFT with the drafts and confidences (76 B: a 32-byte header, a
# status word, 5 ids, 5 confidences); the verify blocks run in the pipelined micro-batches,
# their logits come to rank 0 with the step's, rank 0 decides them at the step's end and
# broadcasts the outcomes (8 B per verify block, one broadcast per step), and each stage rolls
# back its own layers. The 10 requests of serve_n2_spec_fixed give the bytes of its one process
# with --spec fixed:3 (specA.one: texts, logprobs, usage with the repeats' cached tokens, exact
# mode), the same drafts verified / accepted (/metrics, some accepted), and the counters agree:
# the last stage proposed P times and sent P x 76 spec bytes, rank 0 and the last stage each
# ran V >= 1 verify blocks, and rank 0 broadcast 8 x V bytes of outcomes.
if [ -s "$TMP/specA.one.out" ] && [ -s "$TMP/specA.one.met" ]; then
    DS41_MPI_VERBOSE=1 timeout 120 mpiexec -n 2 "$DS41" serve -m "$demo" --port 0 --exact --mpi-timeout 10 --split layers \
        --spec fixed:3 >/dev/null 2>"$TMP/s6.log" &
    s6=$!
    if p6=$(serve_port "$TMP/s6.log"); then
        "$PY" tests/serve/mpi_client.py answers "$p6" >"$TMP/s6.out" 2>&1
        c6=$?
        spec_metrics "$p6" >"$TMP/s6.met" 2>&1
        kill -TERM "$(rank_pid 0)" 2>/dev/null
        wait "$s6"
        s6rc=$?
        sp0=$(sed -n 's/.*\[rank 0\]: --split layers: .*--spec: \([0-9]*\) proposals ([0-9]* batched forwards), \([0-9]*\) verify blocks.*; verify outcomes: [0-9]* steps, \([0-9]*\) bytes.*/\1 \2 \3/p' "$TMP/s6.log")
        sp1=$(sed -n 's/.*\[rank 1\]: --split layers: .*--spec: \([0-9]*\) proposals ([0-9]* batched forwards), \([0-9]*\) verify blocks.*/\1 \2/p' "$TMP/s6.log")
        # a step's proposals (DRAFTS: 2 or more) run on the last stage in one batched forward
        bb1=$(sed -n 's/.*\[rank 1\]: --split layers: .*--spec: [0-9]* proposals (\([0-9]*\) batched forwards).*/\1/p' "$TMP/s6.log")
        sb1=$(sed -n 's/.*\[rank 1\]: pipe: layers 4\.\.7 of 8.*, spec \([0-9]*\) bytes;.*/\1/p' "$TMP/s6.log")
        if [ $c6 -ne 0 ]; then fail serve_split_spec_fixed "a request failed: $(grep -v '^{"' "$TMP/s6.out" | head -c 300)"
        elif ! cmp -s "$TMP/specA.one.out" "$TMP/s6.out"; then
            fail serve_split_spec_fixed "answers differ from one process: $(cmp "$TMP/specA.one.out" "$TMP/s6.out")"
        elif ! cmp -s "$TMP/specA.one.met" "$TMP/s6.met" || [ "$(cut -d' ' -f2 "$TMP/s6.met")" -lt 1 ]; then
            fail serve_split_spec_fixed "drafts verified / accepted: '$(cat "$TMP/s6.met")' (one process: '$(cat "$TMP/specA.one.met")', expected equal, some accepted)"
        elif [ $s6rc -ne 0 ]; then fail serve_split_spec_fixed "the job ended with status $s6rc after SIGTERM: $(tail -n 2 "$TMP/s6.log")"
        elif ! set -- $sp0 $sp1 || [ $# -ne 5 ] || [ "$1" -ne 0 ] || [ "$2" -lt 1 ] || [ "$4" -lt 1 ] || [ "$5" -ne "$2" ] ||
             [ "$3" -ne $((8 * $2)) ] || [ "$sb1" != $((76 * $4)) ] || [ "${bb1:-0}" -lt 1 ] || [ $((2 * bb1)) -gt "$4" ]; then
            fail serve_split_spec_fixed "rank 0 proposals / verify blocks / outcome bytes '$sp0', rank 1 proposals / verify blocks '$sp1', rank 1 spec bytes '$sb1', batched forwards '$bb1' (expected 0 / V / 8 V, P / V, 76 P, 1 to P / 2): $(grep -e 'pipe:' -e 'held here' "$TMP/s6.log" | head -c 600)"
        else pass "serve_split_spec_fixed ($(cat "$TMP/s6.met") drafts verified / accepted; rank 1: $4 proposals ($bb1 batched forwards), $5 verify blocks)"; fi
    else
        fail serve_split_spec_fixed "the server did not start: $(tail -n 2 "$TMP/s6.log")"
        kill "$s6" 2>/dev/null; wait "$s6"
    fi
else
    fail serve_split_spec_fixed "no answers of one process with --spec fixed:3 to compare with"
fi
expect_job split_pipe_batches_malformed "ds41: --pipe-batches: '0x' is not a number of micro-batches in 1..128" 60 \
    "$DS41" serve -m "$demo" --port 0 --split layers --pipe-batches 0x
expect_job split_pipe_batches_alone "ds41: --pipe-batches needs --split layers" 60 "$DS41" serve -m "$demo" --port 0 --pipe-batches 2
expect_job split_serve_dp_refused "ds41 serve: --dp-attention and --split layers are two different splits" 60 \
    mpiexec -n 2 "$DS41" serve -m "$demo" --port 0 --split layers --dp-attention

# ---------------------------------------------------------------- --split layers (pipeline stages)
# Each rank runs a contiguous range of layers (the default stages balance the weight bytes, at
# KV sources unless a cut elsewhere makes the largest stage 5 % smaller: tiny -n 2 = 0-2 / 3-5,
# -n 3 = 0-1 / 2-3 / 4-5 (sources 1 and 3); demo -n 2 = 0-3 / 4-7, -n 3 = 0-1 / 2-4 / 5-7, the
# last stage keeping a replica of source 4), the residual rows (and at a cut that is not a KV
# source the entries, top-k lists and candidate pool the next layers read) crossing point to
# point: tokens and logits bit-identical to one process, exact and fast.
# (`same` runs the one process with the same flags: --split is a job flag, a plain run has one
# stage.) DS41_MPI_VERBOSE's "pipe:" lines give each rank's layers and the rows it moved.
same split_exact_tiny_n3 3 -m "$tiny" --prompt-ids "$P20" -n 12 --exact --ignore-eos --split layers
same split_exact_demo_n2 2 -m "$demo" -p "Once upon a time" -n 24 --exact --ignore-eos --split layers
# demo -n 3, exact (the tokens and logits of split_exact_demo_n2's one process), with stages
# that start at layers that are not KV sources (--split layers:0-2,3-4,5-7; sources 2 and 4),
# and the rows and bytes crossing: the 6-token prompt's CED prefill sends every row (layer 3
# reads source 2, which read every row; T < window), then one row per decode step: 6 + 23 rows
# of 3088 B (4 x (192 + 1) x 4) and a 32-byte header per step, and beside the stream what the
# next stage's layers read of the layers before it (records of 36 + 17 B per entry):
#   into 3: source 2's new entries (ratio 2: 3 in the prefill, then one at each odd position
#     7..27, 11) and layer 2's top-k lists, reused by 3 (a 4-byte width and T x min(32, (P + T)
#     / 2) ids: 4 + 6 x 3 x 4 in the prefill, then sum over P = 6..28 of 4 + 4 x (P + 1) / 2 =
#     23 x 4 + 4 x 201): 14 x 53 + 76 + 896 = 1714 B;
#   into 5: source 4's entries (ratio 1: 6 + 23), layer 4's lists, reused by 5 (4 + 6 x 6 x 4,
#     then 23 x 4 + 4 x (7 + ... + 29) = 92 + 1656), and the candidate pool of 4 that 6 reads (a
#     4-byte count and a byte of block bits per row: 4 + 6, then 23 x 5): 29 x 53 + 148 + 1748 +
#     10 + 115 = 3558 B.
if DS41_MPI_VERBOSE=1 $RUN -n 3 "$DS41" run -m "$demo" -p "Once upon a time" -n 24 --exact --ignore-eos --split layers:0-2,3-4,5-7 \
       --mpi-timeout 30 --dump-logits "$TMP/b.f32" >"$TMP/b.out" 2>"$TMP/b.err" && cmp -s "$TMP/b.out" "$TMP/a.out" &&
   cmp -s "$TMP/b.f32" "$TMP/a.f32"; then
    got=$(sed -n 's/.*pipe: layers \([0-9.]*\) of 8.*sent [0-9]* hops \([0-9]*\) rows \([0-9]*\) bytes (\([0-9]*\) beside the stream.*/\1 \2 \3 \4/p' "$TMP/b.err" | sort | tr '\n' ' ')
    want="0..2 29 $((29 * 3088 + 24 * 32 + 1714)) 1714 3..4 29 $((29 * 3088 + 24 * 32 + 3558)) 3558 5..7 0 0 0 "
    [ "$got" = "$want" ] && pass split_stages_off_source_demo_n3 || fail split_stages_off_source_demo_n3 "got '$got', expected '$want'"
else
    fail split_stages_off_source_demo_n3 "tokens or logits differ from one process, or the job failed: $(tail -n 3 "$TMP/b.err")"
fi
# ids after the last stage: the same run without --dump-logits, with --json, gives one process's
# tokens and top-5 logprobs (the 24 lines before the timing line), and the last stage sent no
# logits row: each of the 24 sampled tokens to the 2 other ranks, 4 B behind a 32-byte header
# (before: 4 x vocab 4096 + 24 B per token and rank), and each row's top 5 computed there to
# rank 0 alone, 52 B (the count, the log-sum-exp, 5 ids, 5 logits) behind the header (before:
# the row to both other ranks)
if "$DS41" run -m "$demo" -p "Once upon a time" -n 24 --exact --ignore-eos --json --spec off >"$TMP/aj.out" 2>"$TMP/aj.err" &&
   DS41_MPI_VERBOSE=1 $RUN -n 3 "$DS41" run -m "$demo" -p "Once upon a time" -n 24 --exact --ignore-eos --split layers \
       --json --mpi-timeout 30 >"$TMP/b.out" 2>"$TMP/b.err" && [ "$(wc -l <"$TMP/aj.out")" = 25 ] &&
   cmp -s <(head -n 24 "$TMP/b.out") <(head -n 24 "$TMP/aj.out"); then
    got=$(sed -n 's/.*pipe: layers 5\.\.7 of 8 + head;.*logits sent \([0-9]*\) bytes, tokens \([0-9]*\) bytes.*/\1 \2/p' "$TMP/b.err")
    [ "$got" = "$((24 * (32 + 52))) $((24 * 2 * (32 + 4)))" ] && pass split_ids_demo_n3 ||
        fail split_ids_demo_n3 "top-logprob / token bytes '$got', expected '2016 1728'"
else
    fail split_ids_demo_n3 "tokens or top logprobs differ from one process, or a run failed: $(tail -n 3 "$TMP/b.err" "$TMP/aj.err")"
fi
same split_fast_demo_n3 3 -m "$demo" -p "Once upon a time" -n 24 --ignore-eos --split layers
# --spec under --split layers: the last stage holds every DSpark target layer (5-7; here it
# starts at 5, behind KV source 4, whose entries, top-k lists and candidate pool cross with the
# stream and whose replica on the last stage the verifies' rollbacks roll back too) and runs the drafter; it sends each step's drafts (64 B behind a 32-byte header) and
# each verify's outcome (8 B + 32) to rank 0. The tokens, every step's spec_step (drafts' conf,
# accepted), the logits and the run's spec counts equal one process's; every step drafts 3 (how
# many steps 24 tokens take follows from the drafter's acceptance: 12 on the shipped demo).
if "$DS41" run -m "$demo" -p "Once upon a time" -n 24 --exact --ignore-eos --spec fixed:3 --json \
       --dump-logits "$TMP/a.f32" >"$TMP/a.out" 2>"$TMP/a.err" &&
   DS41_MPI_VERBOSE=1 $RUN -n 2 "$DS41" run -m "$demo" -p "Once upon a time" -n 24 --exact --ignore-eos --spec fixed:3 \
       --json --split layers:0-4,5-7 --mpi-timeout 30 --dump-logits "$TMP/b.f32" >"$TMP/b.out" 2>"$TMP/b.err"; then
    d=$(/usr/bin/python3 -c "
import json, sys
a, b = (open(f).read().splitlines() for f in sys.argv[1:3])
def spec(o):
    if isinstance(o, dict):
        if 'spec' in o: return o['spec']
        for v in o.values():
            r = spec(v)
            if r is not None: return r
sa, sb = spec(json.loads(a[-1])), spec(json.loads(b[-1]))
ok = a[:-1] == b[:-1] and len(a) == 25 and sa == sb and sa['steps'] >= 1 and sa['drafted'] == 3 * sa['steps']
print(sa['steps'] if ok else 'steps or counts differ: %s vs %s' % (sa, sb))
" "$TMP/a.out" "$TMP/b.out")
    sb=$(sed -n 's/.*pipe: layers 5\.\.7 of 8 + head;.*spec \([0-9]*\) bytes.*/\1/p' "$TMP/b.err")
    if ! [[ "$d" =~ ^[0-9]+$ ]]; then fail split_spec_fixed3_demo_n2 "$d"
    elif ! cmp -s "$TMP/a.f32" "$TMP/b.f32"; then fail split_spec_fixed3_demo_n2 "logits differ ($(cmp "$TMP/a.f32" "$TMP/b.f32" | head -n 1))"
    elif [ "$sb" != $((d * (32 + 64) + d * (32 + 8))) ]; then fail split_spec_fixed3_demo_n2 "the last stage sent '$sb' spec bytes, expected $((d * 136)) for $d steps"
    else pass split_spec_fixed3_demo_n2; fi
else
    fail split_spec_fixed3_demo_n2 "a run failed: $(tail -n 2 "$TMP/a.err") $(tail -n 3 "$TMP/b.err")"
fi
# small43 (the V4.1 layout) in 3 stages from --layer-map, the two later ones starting after the
# last KV source (20): 22-23 keep a replica of 20 and get its top-k lists and candidate pool,
# which they pass on to 24-39 with 20's entries (a replica there too)
same split_exact_small43_n3_map 3 -m "$small" --prompt-ids "$P90" -n 8 --exact --ignore-eos --split layers --layer-map 0-21,22-23,24-39
# perplexity (chunks of 128 rows, every row's logits) with a stage that starts at 3, not a KV source
if $RUN -n 3 "$DS41" perplexity -m "$demo" -f "$TMP/text" -c 128 --json --exact --split layers:0-2,3-4,5-7 --mpi-timeout 30 \
       >"$TMP/p3.json" 2>"$TMP/p3.err"; then   # $TMP/p1.json: the one process of perplexity_n3
    d=$("$PY" -c "
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
print(' '.join(sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in ('seconds', 'tokens_per_s'))))" "$TMP/p1.json" "$TMP/p3.json") ||
        d="(the two JSON files could not be compared)"
    [ -z "$d" ] && pass split_perplexity_n3 || fail split_perplexity_n3 "fields differ: $d"
else
    fail split_perplexity_n3 "$(tail -n 2 "$TMP/p3.err")"
fi
# chat: the replies of chat_n3's one process ($TMP/c1.out; exact, so its default speculation
# emits the plain tokens, and --split layers runs with it off)
if $RUN -n 2 "$DS41" chat -m "$demo" -n 16 --exact --split layers --mpi-timeout 30 <"$TMP/chat.in" >"$TMP/c2.out" 2>"$TMP/c2.err"; then
    [ -s "$TMP/c1.out" ] && cmp -s "$TMP/c1.out" "$TMP/c2.out" && pass split_chat_n2 ||
        fail split_chat_n2 "replies differ: '$(head -c 80 "$TMP/c1.out")' vs '$(head -c 80 "$TMP/c2.out")'"
else
    fail split_chat_n2 "$(tail -n 2 "$TMP/c2.err")"
fi
# the malformed --layer-map corpus (inspect, no MPI): one line naming the range, exit 1, nothing on stdout
n=0 bad=""
for d in tests/malformed/layer-map/*/; do
    "$DS41" inspect --ranks 3 --split layers --layer-map "$(cat "$d/map")" "$demo" >"$TMP/m.out" 2>"$TMP/m.err"; rc=$?
    n=$((n + 1))
    if [ $rc -ne 1 ] || [ "$(wc -l <"$TMP/m.err")" -ne 1 ] || ! grep -qF -- "$(cat "$d/expected")" "$TMP/m.err" || [ -s "$TMP/m.out" ]; then
        bad="$bad $(basename "$d")(exit $rc: $(head -c 200 "$TMP/m.err"))"
    fi
done
[ -z "$bad" ] && [ $n -ge 10 ] && pass "split_layer_map_malformed_corpus ($n cases)" || fail split_layer_map_malformed_corpus "$n cases;$bad"
# refusals that need no job: they come from the flags and the config, the same on every rank
expect_job split_too_many_ranks "8 layers cannot make 7 stages (5 places to cut: a stage starts at a layer 1..5), so at most 6 ranks" 60 \
    "$DS41" inspect --ranks 7 --split layers "$demo"
expect_job split_ranges_empty "ds41: --split layers: needs ranges after the colon" 60 "$DS41" inspect --ranks 2 --split layers: "$demo"
expect_job split_ranges_twice "--split layers:RANGES and --layer-map both give the stages" 60 \
    "$DS41" inspect --ranks 2 --split layers:0-3,4-7 --layer-map 0-3,4-7 "$demo"
expect_job split_expert_map_refused "with --split layers each rank runs all the experts of its layers" 60 \
    "$DS41" run -m "$demo" -p "x" -n 2 --split layers --expert-map "$TMP/map"
expect_job split_missing_stage_file "rank 1: .*noshard" 60 \
    mpiexec -n 1 "$DS41" run -m "$tiny" --prompt-ids 1,2,3 -n 2 --split layers : -n 1 "$DS41" run -m "$TMP/noshard" --prompt-ids 1,2,3 -n 2 --split layers
# the last stage stops mid-decode: rank 0, waiting for its logits, names it within --mpi-timeout
FR_ARGS="--split layers" fault_run split_hung_stage STOP "ds41: rank 1 did not answer within 3.0 s (the sampled token, from the last stage)" 10
FR_ARGS="--split layers" fault_run split_killed_stage_named KILL "^ds41: rank 1 (pid [0-9]* on .*) was killed by signal 9 (SIGKILL" 10

# ---------------------------------------------------------------- run --cache-dir under mpiexec
# Attention replicated: rank 0 alone keeps the store and broadcasts the blocks it reads from disk
# (every rank's memory cache then holds them); --split layers: each stage keeps its layers' part
# in DIR/rank-R and the stages restore the least any of them holds. A 200-id prompt (one whole
# block) run twice on a store, cold then restored from disk, prints the bytes (tokens, every
# logits row) of one process doing the same on its store, and the same prefix-cache line ("T of
# 200 prompt tokens restored (B blocks read from disk"): 0 then 128.
P200=$(ids 200 11 4096)
cache_run() {   # cache_run OUT DIR [ARGS...]: the 200-id prompt with --cache-dir DIR ($CR: the launcher)
    local out=$1 dir=$2; shift 2
    $CR "$DS41" run -m "$demo" --prompt-ids "$P200" -n 8 --exact --ignore-eos --spec off --cache-dir "$dir" \
        --dump-logits "$out.f32" "$@" >"$out" 2>"$out.err" || { echo "$(basename "$out"): status $?: $(tail -n 2 "$out.err")"; return; }
    sed -n 's/^ds41 run: prefix cache: \([0-9]* of 200 prompt tokens restored ([0-9]* blocks read from disk\).*/\1/p' "$out.err" >"$out.pc"
}
cache_same() {   # cache_same REF OUT...: each OUT's tokens and logits are REF's (prints what differs)
    local ref=$1 o; shift
    for o in "$@"; do
        cmp -s "$ref" "$o" && cmp -s "$ref.f32" "$o.f32" || echo "$(basename "$o"): tokens or logits differ from one process"
    done
}
cache_pc() {   # cache_pc OUT T B: OUT's prefix-cache line says T tokens restored, B blocks read from disk
    [ "$(cat "$1.pc" 2>/dev/null)" = "$2 of 200 prompt tokens restored ($3 blocks read from disk" ] ||
        echo "$(basename "$1"): prefix cache '$(cat "$1.pc" 2>/dev/null)' (expected $2 tokens, $3 blocks from disk)"
}
CR="" cache_run "$TMP/r1" "$TMP/rc1"
CR="" cache_run "$TMP/r2" "$TMP/rc1"
d=$(CR="$RUN -n 2" cache_run "$TMP/r3" "$TMP/rc2" --mpi-timeout 30
    CR="$RUN -n 2" cache_run "$TMP/r4" "$TMP/rc2" --mpi-timeout 30
    CR="$RUN -n 2" cache_run "$TMP/r5" "$TMP/rc1" --mpi-timeout 30   # the one process's store
    cache_same "$TMP/r1" "$TMP/r2" "$TMP/r3" "$TMP/r4" "$TMP/r5"
    cache_pc "$TMP/r1" 0 0; cache_pc "$TMP/r2" 128 1; cache_pc "$TMP/r3" 0 0; cache_pc "$TMP/r4" 128 1; cache_pc "$TMP/r5" 128 1
    [ -z "$(ls -d "$TMP"/rc2/rank-* 2>/dev/null)" ] || echo "rank stores under the replicated split: $(ls "$TMP/rc2")")
[ -z "$d" ] && pass run_cache_dir_n2 || fail run_cache_dir_n2 "$(echo "$d" | head -c 600)"
# --split layers: cold then from disk on a store per rank (both hold blocks); then under -n 3
# (other cuts: every stage's store is another fingerprint's, rank 0 says so, nothing restored);
# then with rank 1's blocks removed (rank 0's store still holds the block: the stages agree on
# 0 blocks), after which the run's publish has rank 1's part on disk again (128 restored)
d=$(CR="$RUN -n 2" cache_run "$TMP/r6" "$TMP/rc3" --split layers --mpi-timeout 30
    CR="$RUN -n 2" cache_run "$TMP/r7" "$TMP/rc3" --split layers --mpi-timeout 30
    for r in 0 1; do [ -n "$(find "$TMP/rc3/rank-$r" -name '*.blk' 2>/dev/null)" ] || echo "no blocks in rank-$r's store"; done
    CR="$RUN -n 3" cache_run "$TMP/r8" "$TMP/rc3" --split layers --mpi-timeout 30
    grep -q "rc3/rank-0 holds the blocks of 1 other fingerprint .*other stage cuts or another number of ranks): not read" "$TMP/r8.err" ||
        echo "r8: no note on the other cuts' store: $(grep -v '^ds41 run' "$TMP/r8.err" | head -c 300)"
    find "$TMP/rc3/rank-1" -name '*.blk' -delete
    CR="$RUN -n 2" cache_run "$TMP/r9" "$TMP/rc3" --split layers --mpi-timeout 30
    CR="$RUN -n 2" cache_run "$TMP/r10" "$TMP/rc3" --split layers --mpi-timeout 30
    cache_same "$TMP/r1" "$TMP/r6" "$TMP/r7" "$TMP/r8" "$TMP/r9" "$TMP/r10"
    cache_pc "$TMP/r6" 0 0; cache_pc "$TMP/r7" 128 1; cache_pc "$TMP/r8" 0 0; cache_pc "$TMP/r9" 0 0; cache_pc "$TMP/r10" 128 1)
[ -z "$d" ] && pass run_cache_dir_split_n2 || fail run_cache_dir_split_n2 "$(echo "$d" | head -c 600)"

# ---------------------------------------------------------------- run --trace under mpiexec
# The conformance trace (docs/conformance.md; demo has DSpark stages, so with the proposals):
# attention replicated, rank 0 writes it whole; --split layers, each stage writes its layers'
# files into the same directory (the first stage the tokens, the last the logits and the
# proposals). Either way the directory is one process's, file for file, byte for byte.
d=$("$DS41" run -m "$demo" -p "Once upon a time" -n 6 --exact --ignore-eos --trace "$TMP/t1" >/dev/null 2>"$TMP/t1.err" || echo "one process: $(tail -n 2 "$TMP/t1.err")"
    $RUN -n 2 "$DS41" run -m "$demo" -p "Once upon a time" -n 6 --exact --ignore-eos --trace "$TMP/t2" --mpi-timeout 30 \
        >/dev/null 2>"$TMP/t2.err" || echo "-n 2: $(tail -n 2 "$TMP/t2.err")"
    $RUN -n 2 "$DS41" run -m "$demo" -p "Once upon a time" -n 6 --exact --ignore-eos --trace "$TMP/t3" --split layers \
        --mpi-timeout 30 >/dev/null 2>"$TMP/t3.err" || echo "-n 2 --split layers: $(tail -n 2 "$TMP/t3.err")"
    [ -s "$TMP/t1/dspark.i32" ] && [ -s "$TMP/t1/experts_L7.i32" ] || echo "the one process's trace lacks files: $(ls "$TMP/t1" | tr '\n' ' ')"
    diff -r "$TMP/t1" "$TMP/t2" >/dev/null || echo "-n 2: $(diff -rq "$TMP/t1" "$TMP/t2" | head -n 3)"
    diff -r "$TMP/t1" "$TMP/t3" >/dev/null || echo "-n 2 --split layers: $(diff -rq "$TMP/t1" "$TMP/t3" | head -n 3)")
[ -z "$d" ] && pass "run_trace_n2 ($(ls "$TMP/t1" | wc -l) files)" || fail run_trace_n2 "$(echo "$d" | head -c 600)"
exit 0
