#!/usr/bin/env bash
# Prefill/decode disaggregation (docs/pd.md): ds41 serve --role prefill and --role decode as
# separate processes on this machine, over UCX (TCP on the loopback), against one node.
#   identity: concurrent greedy requests (token-id prompts of 140..420 tokens, one sharing two
#     blocks with another so that the decode node fetches only the blocks past its own hit) give
#     the same choices, logprobs and top alternatives (17 significant digits) as one node: exact
#     kernels with DSpark off and on (--spec fixed:2), fast kernels; the demo model (exact);
#     /metrics counts the remote prefills and the exact frame bytes (blocks x (page bytes +
#     48-byte headers) + RESUME + DONE); every remote prefill installs the shipped state (the
#     decode node replays nothing); the prefill node's /health and /metrics (--http-port) count
#     the same requests, blocks and bytes; a prompt whose first blocks the prefill node's own
#     prefix cache holds restores them there and computes the rest (also with the decoder split);
#   faults (each: the client gets one node's answer, the decode node falls back and counts it,
#     and both nodes serve the next request remotely): unreachable node, flipped byte, truncated
#     frame, a flipped byte, a truncated RESUME frame and one whose checksum is right but whose
#     ring count is not, a hung node (--prefill-timeout), kill -9 of the prefill node mid-transfer, a node
#     with another checkpoint (compatibility hash); --on-prefill-failure fail answers an error
#     naming the cause; a decode node that vanishes after the handshake: the prefill node frees
#     its request within the lease, also when the decode node is then killed;
#   the decoder split (--pd-decoder decode: the stream at the first decoder layer travels, the
#     decode node runs the decoder): the same answers, exact, DSpark off and on, the exact frame
#     bytes, also when the prefill node serves the prompts from its own prefix cache; fast kernels;
#   MPI jobs (mpiexec -n 2, where built with MPI): with DSpark off the identity section's prefill
#     node is a job with --cache-dir, restarted on its store, and a decode job fetches rounds 1-3
#     from it and the decoder split's node (round 3: two blocks from rank 0's disk, the third
#     computed on both ranks); the decode job's follower stopped: a 503 naming it; the splits a
#     role does not take are refused (DS41_PD_MPI_DECODE_ARGS=--dp-attention: the decode job with
#     the flag, by hand);
#   two network namespaces joined by a veth pair (ip netns; root): the prefill node in one, the
#     decode node in the other, UCX over TCP on the veth: four concurrent requests get one node's
#     answers and the veth carries the frames (skipped with a line on stderr where namespaces
#     cannot be made).
# Fault injection: DS41_PD_FAULT (src/pd/pd.h, test-only). Ports: chosen by the system (--port 0).
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./ds41}
PY=${PYTHON:-/usr/bin/python3}
CK=${CK:-build/test-ck}
TMP=$(mktemp -d /tmp/ds41-pd.XXXXXX)
PIDS=()
NS=ds41pd$$ IN=
ns_cleanup() { ip netns del "${NS}0" 2>/dev/null; ip netns del "${NS}1" 2>/dev/null; }
# the ranks of the mpiexec job below carry this tag in their environment, so that the cleanup
# finds exactly them (and a rank stopped on purpose is continued and killed)
tagged() {
    local f p
    for f in $(grep -lzx "DS41_PD_TEST_TAG=$TMP" /proc/[0-9]*/environ 2>/dev/null); do
        p=${f#/proc/}; echo "${p%/environ}"
    done
}
rank_of() {   # rank_of JOB R -> the PID of rank R of the tagged job JOB (DS41_PD_JOB)
    local p
    for p in $(tagged); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = ds41 ] && grep -qzx "PMI_RANK=$2" "/proc/$p/environ" 2>/dev/null &&
            grep -qzx "DS41_PD_JOB=$1" "/proc/$p/environ" 2>/dev/null && echo "$p"
    done | head -n 1
}
# MPI=1 when the MPI jobs below can run (mpiexec there, ds41 built with MPI)
MPI=; command -v mpiexec >/dev/null && ! "$DS41" --help 2>&1 | grep -q "this build has no MPI" && MPI=1
cleanup() {
    for p in $(tagged); do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    ns_cleanup
    rm -rf "$TMP"
}
trap cleanup EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
. tests/lib.sh
if ! ldd "$DS41" 2>/dev/null | grep -q libucp; then
    echo "pd.test.sh: this ds41 was built without UCX; skipped" >&2
    exit 0
fi
ck=$(serve_checkpoint) || { fail pd_checkpoint "serve_checkpoint failed"; exit 1; }
tinyck=$(checkpoint tiny) || { fail pd_checkpoint "checkpoint tiny failed"; exit 1; }

# start_prefill NAME ARGS...: a prefill node on a free port -> PPORT, PPID_ ($PL: a launcher, such as mpiexec)
start_prefill() {
    local name=$1; shift
    $PL "$DS41" serve --role prefill --port 0 "$@" >"$TMP/$name.log" 2>&1 </dev/null &
    PPID_=$!
    PIDS+=("$PPID_")
    PPORT=
    for _ in $(seq 1 300); do
        PPORT=$(sed -n 's/.*listening on ucx:\/\/[0-9.]*:\([0-9]*\).*/\1/p' "$TMP/$name.log" 2>/dev/null)
        [ -n "$PPORT" ] && break
        kill -0 "$PPID_" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$PPORT" ] || { fail "start_$name" "$(tail -n 3 "$TMP/$name.log")"; return 1; }
}
stop() { kill "$1" 2>/dev/null; wait "$1" 2>/dev/null; }
metric() { $IN curl -s -m 10 "http://127.0.0.1:$1/metrics" | sed -n "s/^$2{[^}]*} \([0-9.e+-]*\)$/\1/p"; }
free_port() { "$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }

"$PY" - "$TMP" <<'EOF'
import json, random, sys
r = random.Random(41)
p = lambda n: [r.randrange(2, 500) for _ in range(n)]
a = p(300)
json.dump([a, p(140), p(420), p(260)], open(sys.argv[1] + "/round1.json", "w"))
# round 2: shares a's first two blocks (a local hit on the decode node), and a fresh one
json.dump([a[:256] + p(150), p(200)], open(sys.argv[1] + "/round2.json", "w"))
# round 3 (the MPI decode job's, after the prefill job's restart): a's first two blocks again and
# a new third block, a partial hit in the restarted prefill job's store
json.dump([a[:256] + p(200)], open(sys.argv[1] + "/round3.json", "w"))
EOF
S="-c 1024 --parallel 8 --batch-tokens 64"

# compare NAME ONE_NODE_PORT DECODE_PORT ROUND [extra]: the same lines from both
compare() {
    "$PY" tests/pd/client.py "$2" "$TMP/$4.json" 12 ${5:+"$5"} >"$TMP/$1.one" 2>&1
    "$PY" tests/pd/client.py "$3" "$TMP/$4.json" 12 ${5:+"$5"} >"$TMP/$1.pd" 2>&1
    if cmp -s "$TMP/$1.one" "$TMP/$1.pd" && ! grep -qv '^{' "$TMP/$1.one"; then pass "$1"
    else fail "$1" "answers differ: $(diff "$TMP/$1.one" "$TMP/$1.pd" | head -c 600)"; fi
}

# against NAME SAVED DECODE_PORT ROUND: the decode node's lines against one node's saved ones
# (a fresh one node's: a warm one counts its own prefix-cache hits in usage.cached_tokens)
against() {
    $IN timeout 120 "$PY" tests/pd/client.py "$3" "$TMP/$4.json" 12 >"$TMP/$1.pd" 2>&1
    if cmp -s "$2" "$TMP/$1.pd" && ! grep -qv '^{' "$2"; then pass "$1"
    else fail "$1" "answers differ: $(diff "$2" "$TMP/$1.pd" | head -c 600)"; fi
}

# ---------------------------------------------------------------- identity
# exact, DSpark off and on
# with DSpark off the prefill node is an MPI job (mpiexec -n 2: routed experts split, attention
# replicated; every prefill forward and prefix-cache restore runs on both ranks, PD_SEQ / PD_FWD)
# with a store (--cache-dir: rank 0 reads and writes it, the blocks it reads go to rank 1 first,
# BLOCKS): every check below then holds for it as for one process (the answers, the frame bytes,
# its own prefix cache's partial hit, /health and /metrics on rank 0)
for spec in off fixed:2; do
    tag=${spec%%:*}
    PL= PX=
    [ "$tag" = off ] && [ -n "$MPI" ] &&
        PL="env DS41_PD_TEST_TAG=$TMP DS41_PD_JOB=prefill DS41_MPI_VERBOSE=1 timeout 300 mpiexec -n 2" PX="--mpi-timeout 10 --cache-dir $TMP/pstore"
    PL1=$PL
    start_prefill p_$tag -m "$ck" --exact -c 1024 --parallel 4 --http-port 0 $PX || exit 1
    PL=
    P1=$PPID_; PP1=$PPORT
    PH=$(sed -n 's/.*metrics on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/p_$tag.log")
    serve_start one_$tag -m "$ck" --exact $S --spec $spec || exit 1
    ONE=$PORT; ONEPID=$PID
    serve_start dec_$tag -m "$ck" --exact $S --spec $spec --role decode --prefill 127.0.0.1:$PP1 --remote-prefill-min 100 || exit 1
    DEC=$PORT; DECPID=$PID
    compare pd_exact_spec_${tag}_concurrent $ONE $DEC round1
    compare pd_exact_spec_${tag}_shared_prefix $ONE $DEC round2
    # one node's answer to round 3 after rounds 1 and 2 (its cache holds a's blocks, as the MPI
    # decode job's will: the same usage.cached_tokens)
    [ "$tag" = off ] && [ -n "$MPI" ] && "$PY" tests/pd/client.py $ONE "$TMP/round3.json" 12 >"$TMP/round3.one" 2>&1
    # round 1: 4 remote prefills of 2, 1, 3, 2 blocks; round 2: 1 block past the local hit of 2, then 1
    n=$(metric $DEC ds41:remote_prefills_total); b=$(metric $DEC ds41:kv_transfer_bytes_total)
    f=$(metric $DEC ds41:remote_prefill_fallbacks_total); c=$(metric $DEC ds41:kv_transfer_seconds_count)
    # tiny: 105 B of global KV per token = 13440 B per block over 2 KV sources (2 LAYER headers);
    # a RESUME frame per request (src/store/kvx_resume.h): 112 B head + 12 B for the one
    # compressor + 6 SWA rings x 16 slots x 66 B + the compressor's 2 x 2 rows x 64 FP32 = 7484 B,
    # with DSpark the context rows too: 16 rows x 2 targets x 256 BF16 = 16384 B
    res=$(( 112 + 12 + 6 * 16 * 66 + 2 * 2 * 64 * 4 )); [ "$tag" = fixed ] && res=$(( res + 16 * 2 * 256 * 2 ))
    want=$(( (2 + 1 + 3 + 2 + 1 + 1) * (13440 + 2 * 48) + 6 * (48 + 48 + res) ))
    if [ "$n" = 6 ] && [ "$f" = 0 ] && [ "$c" = 6 ] && [ "$b" = "$want" ]; then pass pd_metrics_spec_$tag
    else fail pd_metrics_spec_$tag "remote $n fallbacks $f transfers $c bytes $b (want 6 0 6 $want): $(grep -m2 'remote prefill failed' "$TMP/dec_$tag.log")"; fi
    # the prefill node's own /metrics (--http-port): the same 6 requests, 10 blocks and bytes
    pn=$(metric "$PH" ds41:prefill_requests_total); pb=$(metric "$PH" ds41:kv_transfer_bytes_sent_total)
    pk=$(metric "$PH" ds41:prefill_blocks_total); pr=$(metric "$PH" ds41:prefill_requests_running)
    pf=$(metric "$PH" ds41:prefill_failures_total); pc=$(metric "$PH" ds41:prefill_capacity)
    health=$(curl -s -m 10 "http://127.0.0.1:$PH/health")
    if [ "$pn" = 6 ] && [ "$pb" = "$want" ] && [ "$pk" = 10 ] && [ "$pr" = 0 ] && [ "$pf" = 0 ] && [ "$pc" = 4 ] &&
        [ "$health" = '{"status":"ok","role":"prefill","requests_running":0,"capacity":4}' ]; then
        pass pd_prefill_http_spec_$tag
    else fail pd_prefill_http_spec_$tag "port '$PH': served $pn blocks $pk bytes $pb (want 6 10 $want), running $pr failed $pf capacity $pc, health $health"; fi
    i=$(grep -c "state installed, 0 rows replayed" "$TMP/dec_$tag.log")
    [ "$i" = 6 ] && pass pd_installed_spec_$tag || fail pd_installed_spec_$tag "$i of 6 remote prefills installed the shipped state"
    # round 2's first prompt: the decode node asks from block 2 (its local hit), and the prefill
    # node restores blocks 0-1 from its own prefix cache (round 1 published them) and computes block 2
    grep -q "1 blocks from block 2 (2 of 3 restored from the prefix cache)" "$TMP/p_$tag.log" &&
        pass pd_fetch_past_local_hit_spec_$tag ||
        fail pd_fetch_past_local_hit_spec_$tag "no request from block 2 with a partial hit in the prefill node's log"
    # the decoder split (--pd-decoder decode): the prefill node stops at layer 3's keys and ships
    # the stream there, the decode node runs the decoder on it; the same answers. Its RESUME frame:
    # 3 encoder rings x 16 x 66 B, the compressor's 1024 B, no context rows (the decode node taps
    # them), 16 + 2 x 15 = 46 stream rows x 4 x (256 + 1) FP32. A second decode node then gets
    # round 1's prompts from the prefill node's own prefix cache (its restore, stopped there too;
    # spec off only: the prefill node never drafts, and the stream it restores is the same bits).
    stop $DECPID; stop $ONEPID
    start_prefill ps_$tag -m "$ck" --exact -c 1024 --parallel 4 --pd-decoder decode || exit 1
    PS=$PPID_; PSP=$PPORT
    # the decode node as an MPI job (mpiexec -n 2: routed experts split, attention replicated):
    # rank 0 fetches, every rank installs the same pages and state (the INSTALL record); with
    # both prefill nodes (the restarted prefill job and the decoder split's, taken in turn: each
    # form is installed, the split's runs the decoder layers on every rank) rounds 1, 2 and 3
    # must give one node's answers, all 7 prompts installed on rank 0 and on rank 1 (round 3's,
    # the 7th fetch, on the prefill job: blocks 0-1 from its store, block 2 computed on both
    # ranks). Then rank 1 is stopped
    # (a follower that hangs or died mid-install): a fresh prompt gets a 503 naming rank 1
    # within --mpi-timeout (3 s) + 2 s, and the job ends non-zero. (Before the split's runs
    # below: the prefill job is stopped right after, its ranks poll while they wait.)
    if [ "$tag" = off ] && [ -n "$MPI" ]; then
        # the prefill job ends cleanly on SIGTERM to rank 0, having run every prefill on both
        # ranks (round 1's 4 and round 2's 2); restarted on the same --cache-dir, it finds them
        # in rank 0's store
        p0=$(rank_of prefill 0)
        [ -n "$p0" ] && kill -TERM "$p0"
        wait $P1; rc=$?
        nf=$(sed -n 's/.*--role prefill: \([0-9]*\) prefill forwards run on every rank.*/\1/p' "$TMP/p_off.log")
        if [ -n "$p0" ] && [ $rc -eq 0 ] && [ -n "$nf" ] && [ "$nf" -ge 6 ] && grep -q "\[rank 1\]: replicated attention" "$TMP/p_off.log"; then
            pass pd_mpi_n2_prefill_job
        else fail pd_mpi_n2_prefill_job "rank 0 '$p0', status $rc, prefill forwards '$nf' (want >= 6): $(tail -n 3 "$TMP/p_off.log")"; fi
        PL=$PL1
        start_prefill p_off2 -m "$ck" --exact -c 1024 --parallel 4 $PX || exit 1
        PL=
        P1=$PPID_; PP1=$PPORT
        DS41_PD_TEST_TAG=$TMP DS41_PD_JOB=decode DS41_MPI_VERBOSE=1 timeout 120 mpiexec -n 2 "$DS41" serve --port 0 -m "$ck" --exact $S \
            --mpi-timeout 3 ${DS41_PD_MPI_DECODE_ARGS:-} --role decode --prefill 127.0.0.1:$PP1,127.0.0.1:$PSP --remote-prefill-min 100 \
            >"$TMP/mpi_dec.log" 2>&1 </dev/null &
        MJ=$!
        MPORT=
        for _ in $(seq 1 300); do
            MPORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/mpi_dec.log" 2>/dev/null)
            [ -n "$MPORT" ] && break
            kill -0 $MJ 2>/dev/null || break
            sleep 0.1
        done
        if [ -n "$MPORT" ]; then
            against pd_mpi_n2_decode_concurrent "$TMP/pd_exact_spec_off_concurrent.one" $MPORT round1
            against pd_mpi_n2_decode_shared_prefix "$TMP/pd_exact_spec_off_shared_prefix.one" $MPORT round2
            against pd_mpi_n2_decode_store_hit "$TMP/round3.one" $MPORT round3
            n=$(metric $MPORT ds41:remote_prefills_total); f=$(metric $MPORT ds41:remote_prefill_fallbacks_total)
            i0=$(grep -c "state installed, 0 rows replayed" "$TMP/mpi_dec.log")
            i1=$(grep -c "\[rank 1\]: remote prefill of blocks .*: state installed" "$TMP/mpi_dec.log")
            u1=$(grep -c "remote prefill from 127.0.0.1:$PP1:" "$TMP/mpi_dec.log"); u2=$(grep -c "remote prefill from 127.0.0.1:$PSP:" "$TMP/mpi_dec.log")
            # (by hand, DS41_PD_MPI_DECODE_ARGS=--dp-attention: only each sequence's owner installs
            # it, rank 1 some of the 7 and rank 0 the others; rank 0's line is printed for all 7)
            w1=7; [ "$i1" -ge 1 ] && [ "$i1" -lt 7 ] && case " ${DS41_PD_MPI_DECODE_ARGS:-} " in *" --dp-attention "*) w1=$i1;; esac
            if [ "$n" = 7 ] && [ "$f" = 0 ] && [ "$i0" = 7 ] && [ "$i1" = $w1 ] && [ "$u1" -ge 1 ] && [ "$u2" -ge 1 ]; then
                pass pd_mpi_n2_decode_installed
            else fail pd_mpi_n2_decode_installed "remote $n fallbacks $f, installed on rank 0 $i0 and rank 1 $i1 (want 7 0 7 7; under --dp-attention 1..6 on rank 1), from the prefill job $u1 and the split's $u2 (want >= 1 each)"; fi
            r1=$(rank_of decode 1)
            "$PY" - "$TMP" <<'PYEOF'
import json, random, sys
r = random.Random(29)
json.dump([[r.randrange(2, 500) for _ in range(300)]], open(sys.argv[1] + "/fresh.json", "w"))
PYEOF
            t0=$(date +%s.%N)
            [ -n "$r1" ] && kill -STOP "$r1"
            timeout 60 "$PY" tests/pd/client.py $MPORT "$TMP/fresh.json" 12 >"$TMP/mpi_fault.out" 2>&1
            wait $MJ; rc=$?
            dt=$("$PY" -c "print(round($(date +%s.%N) - $t0, 2))")
            [ -n "$r1" ] && { kill -CONT "$r1"; kill -9 "$r1"; } 2>/dev/null
            if [ -n "$r1" ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "HTTP 503.*rank 1" "$TMP/mpi_fault.out" &&
                grep -q "rank 1 did not answer" "$TMP/mpi_dec.log" && "$PY" -c "import sys; sys.exit(0 if $dt < 15 else 1)"; then
                pass pd_mpi_n2_decode_follower_lost
            else fail pd_mpi_n2_decode_follower_lost "rank 1 pid '$r1', job status $rc after $dt s, client: $(head -c 300 "$TMP/mpi_fault.out"); $(grep -m1 "did not answer" "$TMP/mpi_dec.log")"; fi
        else
            fail pd_mpi_n2_decode_start "$(tail -n 3 "$TMP/mpi_dec.log")"
            kill $MJ 2>/dev/null; wait $MJ 2>/dev/null
        fi
        # the restarted prefill job: its share of rounds 1 and 2 restored from the store (whole
        # hits, no forward), round 3's block 2 computed past blocks 0-1 (one PD_FWD at least); the
        # blocks rank 0 read from disk went to rank 1 (13440 bytes each: 105 B a token x 128), and
        # it ends cleanly on SIGTERM
        p0=$(rank_of prefill 0)
        [ -n "$p0" ] && kill -TERM "$p0"
        wait $P1; rc=$?
        nf=$(sed -n 's/.*--role prefill: \([0-9]*\) prefill forwards run on every rank.*/\1/p' "$TMP/p_off2.log")
        sb=$(sed -n 's/.*--cache-dir: \([0-9]*\) blocks read from the store sent to the other ranks (\([0-9]*\) bytes).*/\1 \2/p' "$TMP/p_off2.log")
        set -- $sb
        if [ -n "$p0" ] && [ $rc -eq 0 ] && [ -n "$nf" ] && [ "$nf" -ge 1 ] && [ "${1:-0}" -ge 1 ] && [ "${2:-}" = $(( ${1:-0} * 13440 )) ] &&
            grep -q "1 blocks from block 2 (2 of 3 restored from the prefix cache)" "$TMP/p_off2.log"; then
            pass pd_mpi_n2_prefill_store
        else fail pd_mpi_n2_prefill_store "rank 0 '$p0', status $rc, prefill forwards '$nf' (want >= 1), blocks and bytes shipped '$sb', $(grep -c "from block" "$TMP/p_off2.log") requests: $(tail -n 3 "$TMP/p_off2.log")"; fi
    fi
    runs=1; [ "$tag" = off ] && runs="1 2"
    for run in $runs; do
        serve_start decs${run}_$tag -m "$ck" --exact $S --spec $spec --role decode --prefill 127.0.0.1:$PSP \
            --remote-prefill-min 100 || exit 1
        against pd_split${run}_exact_spec_${tag}_concurrent "$TMP/pd_exact_spec_${tag}_concurrent.one" $PORT round1
        [ $run = 1 ] && against pd_split_exact_spec_${tag}_shared_prefix "$TMP/pd_exact_spec_${tag}_shared_prefix.one" \
            $PORT round2
        # round 3 too where the MPI decode job ran (its round 2 may have given this node all of
        # a's 3 blocks, in the race of two concurrent fetches; round 3's third block went to the
        # prefill job): blocks 0-1 restored here, block 2 computed, whatever that race gave
        r3=; [ $run = 1 ] && [ -f "$TMP/round3.one" ] && r3=1 &&
            against pd_split_exact_spec_${tag}_partial_hit "$TMP/round3.one" $PORT round3
        n=$(metric $PORT ds41:remote_prefills_total); b=$(metric $PORT ds41:kv_transfer_bytes_total)
        res=$(( 112 + 12 + 3 * 16 * 66 + 2 * 2 * 64 * 4 + 46 * 4 * 257 * 4 ))
        blocks=8 reqs=4; [ $run = 1 ] && blocks=10 reqs=6; [ -n "$r3" ] && blocks=11 reqs=7
        want=$(( blocks * (13440 + 2 * 48) + reqs * (48 + 48 + res) ))
        i=$(grep -c "state installed, 0 rows replayed" "$TMP/decs${run}_$tag.log")
        if [ "$n" = $reqs ] && [ "$b" = "$want" ] && [ "$i" = $reqs ]; then pass pd_split${run}_metrics_spec_$tag
        else fail pd_split${run}_metrics_spec_$tag "remote $n, bytes $b, installed $i (want $reqs $want $reqs)"; fi
        stop $PID
    done
    # the partial hit with the split: 384 - 2 x 128 = 128 computed rows cover the stream's 46
    grep -q "1 blocks from block 2 (2 of 3 restored from the prefix cache)" "$TMP/ps_$tag.log" &&
        pass pd_split_partial_hit_spec_$tag || fail pd_split_partial_hit_spec_$tag "$(grep -m3 "from block" "$TMP/ps_$tag.log")"
    grep -q "decoder on the decode node" "$TMP/ps_$tag.log" && pass pd_split_announced_spec_$tag ||
        fail pd_split_announced_spec_$tag "$(head -n 2 "$TMP/ps_$tag.log")"
    stop $PS
    [ "$tag" = off ] && [ -n "$MPI" ] || stop $P1   # (the MPI prefill job stopped above)
done

# fast kernels (batch invariant: equal to one node)
start_prefill p_fast -m "$ck" -c 1024 --parallel 4 || exit 1
PF=$PPID_
serve_start one_fast -m "$ck" $S --spec off || exit 1
ONE=$PORT; ONEPID=$PID
serve_start dec_fast -m "$ck" $S --spec off --role decode --prefill 127.0.0.1:$PPORT --remote-prefill-min 100 || exit 1
compare pd_fast_concurrent $ONE $PORT round1
[ "$(metric $PORT ds41:remote_prefills_total)" = 4 ] && pass pd_fast_remote ||
    fail pd_fast_remote "not 4 remote prefills: $(grep -m2 'remote prefill failed' "$TMP/dec_fast.log")"
stop $PID; stop $ONEPID; stop $PF
# the decoder split with fast kernels: equal to one node as well
start_prefill ps_fast -m "$ck" -c 1024 --parallel 4 --pd-decoder decode || exit 1
PSF=$PPID_
serve_start decs_fast -m "$ck" $S --spec off --role decode --prefill 127.0.0.1:$PPORT --remote-prefill-min 100 || exit 1
against pd_split_fast_concurrent "$TMP/pd_fast_concurrent.one" $PORT round1
[ "$(metric $PORT ds41:remote_prefills_total)" = 4 ] && pass pd_split_fast_remote ||
    fail pd_split_fast_remote "not 4 remote prefills: $(grep -m2 'remote prefill failed' "$TMP/decs_fast.log")"
stop $PID; stop $PSF

# the demo model (exact, DSpark auto measured once per server: spec off here for time)
start_prefill p_demo -m models/demo --exact -c 2048 --parallel 2 || exit 1
PD_=$PPID_
serve_start one_demo -m models/demo --exact -c 2048 --parallel 4 --spec off || exit 1
ONE=$PORT; ONEPID=$PID
serve_start dec_demo -m models/demo --exact -c 2048 --parallel 4 --spec off --role decode --prefill 127.0.0.1:$PPORT \
    --remote-prefill-min 100 || exit 1
"$PY" - "$TMP" <<'EOF'
import json, random, sys
r = random.Random(7)
json.dump([[r.randrange(3, 4000) for _ in range(n)] for n in (700, 300)], open(sys.argv[1] + "/demo.json", "w"))
EOF
compare pd_demo_exact $ONE $PORT demo
[ "$(metric $PORT ds41:remote_prefills_total)" = 2 ] && pass pd_demo_remote ||
    fail pd_demo_remote "$(metric $PORT ds41:remote_prefills_total) remote prefills, not 2: $(grep -m2 -i 'remote\|fail' "$TMP/dec_demo.log")"
stop $PID; stop $ONEPID; stop $PD_

# ---------------------------------------------------------------- faults
# the reference answers: one node, exact, spec off
serve_start ref -m "$ck" --exact $S --spec off || exit 1
REF=$PORT; REFPID=$PID
"$PY" tests/pd/client.py $REF "$TMP/round1.json" 12 >"$TMP/ref.out" 2>&1
"$PY" - "$TMP" <<'EOF'
import json, sys
t = sys.argv[1]
p = json.load(open(t + "/round1.json"))
json.dump([p[0]], open(t + "/one.json", "w"))
json.dump([p[2]], open(t + "/two.json", "w"))
EOF
head -n 1 "$TMP/ref.out" >"$TMP/ref.one"
sed -n 3p "$TMP/ref.out" >"$TMP/ref.two"

# fault NAME PREFILL_PORT [decode options...]: a fresh decode node; request one (the fault) must
# get the reference answer and count a fallback; request two must be served remotely
fault() {
    local name=$1 pport=$2; shift 2
    serve_start d_$name -m "$ck" --exact $S --spec off --role decode --prefill 127.0.0.1:$pport --remote-prefill-min 100 "$@" ||
        return 1
    local t0 t1
    t0=$(date +%s.%N)
    "$PY" tests/pd/client.py $PORT "$TMP/one.json" 12 >"$TMP/$name.out" 2>&1
    t1=$(date +%s.%N)
    FAULT_SECONDS=$("$PY" -c "print(round($t1 - $t0, 2))")
    if cmp -s "$TMP/$name.out" "$TMP/ref.one" && [ "$(metric $PORT ds41:remote_prefill_fallbacks_total)" = 1 ] &&
        grep -q "prefilling locally" "$TMP/d_$name.log"; then pass pd_fault_$name
    else fail pd_fault_$name "answer $(head -c 200 "$TMP/$name.out"), fallbacks $(metric $PORT ds41:remote_prefill_fallbacks_total); $(grep -m1 'remote prefill failed' "$TMP/d_$name.log")"; fi
    DPORT=$PORT; DPID=$PID
}
# after: the next request is remote and correct (both nodes keep serving)
after() {
    "$PY" tests/pd/client.py $DPORT "$TMP/two.json" 12 >"$TMP/$1.after" 2>&1
    if cmp -s "$TMP/$1.after" "$TMP/ref.two" && [ "$(metric $DPORT ds41:remote_prefills_total)" = 1 ]; then pass pd_fault_${1}_then_serves
    else fail pd_fault_${1}_then_serves "$(head -c 200 "$TMP/$1.after"), remote $(metric $DPORT ds41:remote_prefills_total)"; fi
    stop $DPID
}

fault unreachable "$(free_port)"
grep -q "remote prefill failed" "$TMP/d_unreachable.log" && pass pd_fault_unreachable_logged || fail pd_fault_unreachable_logged "no log line"
stop $DPID

for kind in flip truncate rflip rtruncate rbad; do
    DS41_PD_FAULT=$kind:1 start_prefill p_$kind -m "$ck" --exact -c 1024 --parallel 4 || exit 1
    fault $kind $PPORT
    grep -q "pd-fault" "$TMP/p_$kind.log" || fail pd_fault_${kind}_injected "the fault did not fire"
    after $kind
    kill -0 $PPID_ 2>/dev/null && pass pd_fault_${kind}_prefill_alive || fail pd_fault_${kind}_prefill_alive "prefill node gone"
    stop $PPID_
done
grep -q "checksum mismatch" "$TMP/d_flip.log" && pass pd_fault_flip_named || fail pd_fault_flip_named "$(grep -m1 failed "$TMP/d_flip.log")"
grep -q "RESUME frame payload checksum mismatch" "$TMP/d_rflip.log" && pass pd_fault_rflip_named ||
    fail pd_fault_rflip_named "$(grep -m1 failed "$TMP/d_rflip.log")"
grep -q "RESUME payload: ring count 7 (expected 6)" "$TMP/d_rbad.log" && pass pd_fault_rbad_named ||
    fail pd_fault_rbad_named "$(grep -m1 failed "$TMP/d_rbad.log")"

# a hung node: the decode node waits --prefill-timeout, then prefills locally
DS41_PD_FAULT=stall:1 start_prefill p_hung -m "$ck" --exact -c 1024 --parallel 4 || exit 1
# (4 s: the next request's first frame comes after the first KV source's layers, slow under ASan)
fault hung $PPORT --prefill-timeout 4000
"$PY" -c "import sys; sys.exit(0 if 3.9 < $FAULT_SECONDS < 25 else 1)" && pass pd_fault_hung_bounded ||
    fail pd_fault_hung_bounded "answered after $FAULT_SECONDS s (timeout 4 s)"
grep -q "timed out" "$TMP/d_hung.log" && pass pd_fault_hung_named || fail pd_fault_hung_named "$(grep -m1 failed "$TMP/d_hung.log")"
after hung   # the stalled request holds one slot of 4; the next is served
stop $PPID_

# kill -9 of the prefill node mid-transfer (it stalls at its first LAYER frame; the decode node
# would wait 60 s): the decode node sees the connection fail and prefills locally
DS41_PD_FAULT=stall:1 start_prefill p_kill -m "$ck" --exact -c 1024 --parallel 4 || exit 1
KP=$PPID_; KPORT=$PPORT
disown $KP   # killed -9 below on purpose: no job-control notice
( for _ in $(seq 1 200); do grep -q "pd-fault: stalled" "$TMP/p_kill.log" && break; sleep 0.05; done; kill -9 $KP ) &
PIDS+=($!)
fault killed $KPORT --prefill-timeout 60000
"$PY" -c "import sys; sys.exit(0 if $FAULT_SECONDS < 30 else 1)" && pass pd_fault_killed_fast ||
    fail pd_fault_killed_fast "answered after $FAULT_SECONDS s"
stop $DPID

# a compatibility mismatch: the prefill node serves another checkpoint (same tensors, another config)
start_prefill p_other -m "$tinyck" --exact -c 128 --parallel 4 || exit 1
fault mismatch $PPORT
grep -q "compatibility hash mismatch" "$TMP/d_mismatch.log" && pass pd_fault_mismatch_named ||
    fail pd_fault_mismatch_named "$(grep -m1 failed "$TMP/d_mismatch.log")"
grep -q "compatibility hash mismatch" "$TMP/p_other.log" && pass pd_fault_mismatch_prefill_logged ||
    fail pd_fault_mismatch_prefill_logged "no line on the prefill node"
stop $DPID; stop $PPID_

# --on-prefill-failure fail: an error that names the cause; the server keeps serving
serve_start d_failmode -m "$ck" --exact $S --spec off --role decode --prefill 127.0.0.1:$(free_port) \
    --remote-prefill-min 100 --on-prefill-failure fail || exit 1
"$PY" tests/pd/client.py $PORT "$TMP/one.json" 12 >"$TMP/failmode.out" 2>&1
grep -q "remote prefill failed" "$TMP/failmode.out" && pass pd_fail_mode_error || fail pd_fail_mode_error "$(head -c 300 "$TMP/failmode.out")"
"$PY" - "$TMP" <<'EOF'
import json, sys
json.dump([list(range(2, 60))], open(sys.argv[1] + "/short.json", "w"))
EOF
"$PY" tests/pd/client.py $PORT "$TMP/short.json" 4 >"$TMP/failmode.short" 2>&1 && pass pd_fail_mode_short_local ||
    fail pd_fail_mode_short_local "a short prompt (no remote prefill) failed: $(head -c 200 "$TMP/failmode.short")"
stop $PID

# a decode node that vanishes after the handshake: the prefill node frees its request within the
# lease (2 s) while the decode node hangs, and again when a second one is killed -9
start_prefill p_lease -m "$ck" --exact -c 1024 --parallel 4 --lease 2000 || exit 1
LP=$PPID_; LPORT=$PPORT
for how in hang kill; do
    DS41_PD_FAULT=vanish:1 serve_start d_vanish_$how -m "$ck" --exact $S --spec off --role decode \
        --prefill 127.0.0.1:$LPORT --remote-prefill-min 100 --prefill-timeout 60000 || exit 1
    VP=$PID
    before=$(grep -c "its state is freed" "$TMP/p_lease.log")
    "$PY" tests/pd/client.py $PORT "$TMP/one.json" 12 >/dev/null 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 200); do grep -q "pd-fault: vanished" "$TMP/d_vanish_$how.log" && break; sleep 0.05; done
    t0=$(date +%s.%N)
    [ $how = kill ] && { kill -9 $VP; wait $VP; } 2>/dev/null
    for _ in $(seq 1 100); do [ "$(grep -c "its state is freed" "$TMP/p_lease.log")" -gt "$before" ] && break; sleep 0.05; done
    dt=$("$PY" -c "import time; print(round(time.time() - $t0, 2))" 2>/dev/null)
    line=$(grep "its state is freed" "$TMP/p_lease.log" | tail -n 1)
    if [ "$(grep -c "its state is freed" "$TMP/p_lease.log")" -gt "$before" ] && echo "$line" | grep -q "(0 requests held)"; then
        pass pd_decode_vanished_${how}_freed
    else fail pd_decode_vanished_${how}_freed "no free within 5 s: $(tail -n 2 "$TMP/p_lease.log")"; fi
    { kill -9 $VP; wait $VP; } 2>/dev/null
done
# the prefill node still serves
serve_start d_after_lease -m "$ck" --exact $S --spec off --role decode --prefill 127.0.0.1:$LPORT --remote-prefill-min 100 || exit 1
"$PY" tests/pd/client.py $PORT "$TMP/two.json" 12 >"$TMP/lease.after" 2>&1
cmp -s "$TMP/lease.after" "$TMP/ref.two" && [ "$(metric $PORT ds41:remote_prefills_total)" = 1 ] && pass pd_lease_then_serves ||
    fail pd_lease_then_serves "$(head -c 200 "$TMP/lease.after")"
stop $PID; stop $LP; stop $REFPID

# ---------------------------------------------------------------- two network namespaces
# The prefill node in one namespace, the decode node (and the client) in the other, joined by a
# veth pair (tests/netns.sh: a /30 subnet picked at random), UCX over TCP on each side's veth
# end: round 1's four prompts at once must get one node's answers (exact, spec off, saved
# above), all four prefilled remotely, and the prefill node's veth end must have carried at
# least the frame bytes the decode node counted (the pages went over the link, not through
# shared memory). Every wait is bounded (the nodes' start 30 s, the client 60 s); the trap
# deletes the namespaces whatever happens; skipped with a line on stderr where they cannot be made.
. tests/netns.sh
# in_ns NS DEV FILE: a launcher that runs this ds41 inside NS with UCX over TCP on DEV only
in_ns() {
    printf '#!/bin/sh\nexec ip netns exec %s env UCX_TLS=tcp UCX_NET_DEVICES=%s %s "$@"\n' "$1" "$2" \
        "$(readlink -f "$DS41")" >"$3"
    chmod +x "$3"
}
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && ip netns add "${NS}0" 2>/dev/null && ip netns add "${NS}1" 2>/dev/null &&
    ip link add "${NS}a" netns "${NS}0" type veth peer name "${NS}b" netns "${NS}1" 2>/dev/null && ns_pair_up; then
    in_ns "${NS}0" "${NS}a" "$TMP/ds41_p"; in_ns "${NS}1" "${NS}b" "$TMP/ds41_d"
    addr=$(ip -n "${NS}0" -4 -o addr show dev "${NS}a" | sed -n 's/.* inet \([0-9.]*\)\/.*/\1/p')
    peer=$(ip -n "${NS}1" -4 -o addr show dev "${NS}b" | sed -n 's/.* inet \([0-9.]*\)\/.*/\1/p')
    ND= NP=
    DS41=$TMP/ds41_p start_prefill ns_p --host "$addr" -m "$ck" --exact -c 1024 --parallel 4 && NP=$PPID_ &&
        DS41=$TMP/ds41_d serve_start ns_d -m "$ck" --exact $S --spec off --role decode --prefill "$addr:$PPORT" \
            --remote-prefill-min 100 && ND=$PID && {
        IN="ip netns exec ${NS}1"
        tx0=$(ip netns exec "${NS}0" cat "/sys/class/net/${NS}a/statistics/tx_bytes")
        against pd_two_namespaces_veth_concurrent "$TMP/pd_exact_spec_off_concurrent.one" $PORT round1
        tx1=$(ip netns exec "${NS}0" cat "/sys/class/net/${NS}a/statistics/tx_bytes")
        n=$(metric $PORT ds41:remote_prefills_total); b=$(metric $PORT ds41:kv_transfer_bytes_total)
        IN=
        from=$(grep -c "from $peer:" "$TMP/ns_p.log")
        if [ "$n" = 4 ] && [ "$from" = 4 ] && [ -n "$b" ] && [ "$b" -gt 0 ] && [ $((tx1 - tx0)) -ge "$b" ]; then
            pass pd_two_namespaces_veth_transfer
        else fail pd_two_namespaces_veth_transfer "remote $n, requests from $peer $from, frame bytes $b, veth carried $((tx1 - tx0)) B: $(tail -n 2 "$TMP/ns_p.log" "$TMP/ns_d.log")"; fi
    }
    [ -n "$ND" ] && stop $ND; [ -n "$NP" ] && stop $NP
    ns_cleanup
else
    ns_cleanup
    echo "pd.test.sh: SKIP pd_two_namespaces_veth: cannot make two network namespaces and a veth pair here (needs root and ip netns)" >&2
fi

# ds41 inspect --role: the prefill node's weights are the embedding, every layer but the last
# and the last layer's SWA K path, no head, no DSpark stage (tiny: 305 of 418 tensors); the
# decode node's all of them
"$DS41" inspect --role prefill "$ck" >"$TMP/rp" 2>&1; "$DS41" inspect --role decode "$ck" >"$TMP/rd" 2>&1
tot=$("$PY" -c "
import json, struct, sys
f = open('$ck/model.safetensors', 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
print(sum(v['data_offsets'][1] - v['data_offsets'][0] for k, v in h.items() if k != '__metadata__'))")
if grep -q "^role prefill: 305 tensors, .* of $tot " "$TMP/rp" && grep -q "^role decode: 418 tensors, $tot bytes" "$TMP/rd"; then
    pass pd_inspect_roles
else fail pd_inspect_roles "$(cat "$TMP/rp" "$TMP/rd") (checkpoint tensors $tot bytes)"; fi
"$DS41" inspect --role sideways "$ck" >/dev/null 2>&1; [ $? -eq 2 ] && pass pd_inspect_bad_role || fail pd_inspect_bad_role "not status 2"
# --pd-decoder decode: the embedding, layers 0-2 and layer 3's KV path (194 tensors, 2,879,416 B)
"$DS41" inspect --role prefill --pd-decoder decode "$ck" >"$TMP/rs" 2>&1
grep -q "^role prefill: 194 tensors, 2879416 bytes .* of $tot " "$TMP/rs" && pass pd_inspect_split ||
    fail pd_inspect_split "$(cat "$TMP/rs")"
"$DS41" inspect --role decode --pd-decoder decode "$ck" >/dev/null 2>"$TMP/u0"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--pd-decoder goes with --role prefill" "$TMP/u0" && pass pd_inspect_split_usage ||
    fail pd_inspect_split_usage "status $rc: $(cat "$TMP/u0")"
"$DS41" serve -m "$ck" --role decode --pd-decoder decode --port 0 >/dev/null 2>"$TMP/u0"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--pd-decoder is for --role prefill" "$TMP/u0" && pass pd_usage_split_role ||
    fail pd_usage_split_role "status $rc: $(cat "$TMP/u0")"
"$DS41" serve -m "$ck" --role decode --http-port 0 --prefill 127.0.0.1:1 --port 0 >/dev/null 2>"$TMP/u0"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--http-port is for --role prefill" "$TMP/u0" && pass pd_usage_http_port_role ||
    fail pd_usage_http_port_role "status $rc: $(cat "$TMP/u0")"
"$DS41" serve -m "$ck" --role prefill --pd-decoder sideways --port 0 >/dev/null 2>"$TMP/u0"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--pd-decoder must be prefill or decode, not 'sideways'" "$TMP/u0" && pass pd_usage_split_value ||
    fail pd_usage_split_value "status $rc: $(cat "$TMP/u0")"

# usage errors
"$DS41" serve -m "$ck" --role decode --port 0 >/dev/null 2>"$TMP/u1"; rc=$?
[ $rc -eq 1 ] && grep -q -- "--prefill HOST:PORT" "$TMP/u1" && pass pd_usage_no_nodes || fail pd_usage_no_nodes "status $rc: $(cat "$TMP/u1")"
"$DS41" serve -m "$ck" --role decode --prefill nohost --port 0 >/dev/null 2>"$TMP/u2"; rc=$?
[ $rc -ne 0 ] && pass pd_usage_bad_node || fail pd_usage_bad_node "status $rc"
"$DS41" serve -m "$ck" --role decode --prefill 127.0.0.1:x --port 0 >/dev/null 2>"$TMP/u3"; rc=$?
[ $rc -eq 1 ] && grep -q "not HOST:PORT" "$TMP/u3" && pass pd_usage_bad_port || fail pd_usage_bad_port "status $rc: $(cat "$TMP/u3")"
"$DS41" serve -m "$ck" --role sideways >/dev/null 2>"$TMP/u4"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--role" "$TMP/u4" && pass pd_usage_bad_role || fail pd_usage_bad_role "status $rc"
"$DS41" serve -m "$ck" --role prefill --no-prefix-cache >/dev/null 2>"$TMP/u5"; rc=$?
[ $rc -eq 2 ] && grep -q "prefix cache" "$TMP/u5" && pass pd_usage_no_cache || fail pd_usage_no_cache "status $rc"
# under mpiexec the splits a role does not take are refused before the model loads (about 0.3 s each)
if [ -n "$MPI" ]; then
    timeout 60 mpiexec -n 2 "$DS41" serve -m "$ck" --role decode --split layers --prefill 127.0.0.1:1 --port 0 \
        >/dev/null 2>"$TMP/u6" </dev/null; rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "--role decode under mpiexec takes the expert split (attention replicated or --dp-attention), not --split layers" "$TMP/u6" &&
        pass pd_usage_mpi_decode_split || fail pd_usage_mpi_decode_split "status $rc: $(head -c 300 "$TMP/u6")"
    timeout 60 mpiexec -n 2 "$DS41" serve -m "$ck" --role prefill --dp-attention --port 0 >/dev/null 2>"$TMP/u7" </dev/null; rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "--role prefill under mpiexec takes the expert split with replicated attention only, not --dp-attention" "$TMP/u7" &&
        pass pd_usage_mpi_prefill_dp || fail pd_usage_mpi_prefill_dp "status $rc: $(head -c 300 "$TMP/u7")"
fi
