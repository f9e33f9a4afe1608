#!/usr/bin/env bash
# Engram off RAM (P4) end to end (docs/engram-offram.md):
#   - bad --engram-mode / --engram-cache values are refused naming the flag;
#   - ds41 run --exact on tiny: tokens and --dump-logits identical under ram, mmap, prefetch
#     (and prefetch submitting every slot's reads at once, DS41_ENGRAM_SPLIT=0, and polling the
#     ring before it sleeps, DS41_ENGRAM_SPIN_US);
#   - ds41 bench prints the prefetch line (hit rate, bytes read, stall per step), and ds41
#     bench --engram the step's timeline under prefetch (zero under ram);
#   - ds41 serve --engram-mode prefetch exposes the ds41:engram_* counters on /metrics;
#   - under a cgroup v1 memory limit (48 MiB) smaller than the Engram tables (tests/configs/
#     tiny-bigengram: 99 MB of tables), auto mode picks prefetch, and prefetch and mmap inside
#     the limit give the tokens and logits of ram outside it. Skipped, with the reason, when not
#     root or without a v1 memory controller.
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./build/ds41}
PY=${PYTHON:-/usr/bin/python3}
CK=build/test-ck
TMP=$(mktemp -d /tmp/ds41-engram.XXXXXX)
PIDS=()
CG=
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    # the cgroup goes once its processes have exited (they are only ours, run in the foreground)
    [ -n "$CG" ] && [ -d "$CG" ] && rmdir "$CG" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
mkdir -p "$CK"
export XDG_CACHE_HOME="$TMP/cache"
. tests/lib.sh
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

tiny=$(checkpoint tiny) || exit 1
P=$(ids 20 4 256)

# ---- flags
if "$DS41" run -m "$tiny" --prompt-ids 1,2 -n 1 --engram-mode disk >/dev/null 2>"$TMP/err"; then
    fail bad_mode "accepted --engram-mode disk"
elif grep -q "engram-mode must be auto, ram, mmap or prefetch, not 'disk'" "$TMP/err"; then pass bad_mode
else fail bad_mode "$(cat "$TMP/err")"; fi
if "$DS41" bench -m "$tiny" --engram-cache lots >/dev/null 2>"$TMP/err"; then
    fail bad_cache "accepted --engram-cache lots"
elif grep -q -- "--engram-cache: 'lots' is not a byte count" "$TMP/err"; then pass bad_cache
else fail bad_cache "$(cat "$TMP/err")"; fi

# ---- identity through the CLI
for m in ram mmap prefetch; do
    "$DS41" run -m "$tiny" --prompt-ids "$P" -n 12 --exact --ignore-eos --spec off --engram-mode $m \
        --dump-logits "$TMP/$m.f32" >"$TMP/$m.txt" 2>"$TMP/$m.err" || { fail run_$m "$(tail -n 2 "$TMP/$m.err")"; }
done
for v in DS41_ENGRAM_SPLIT=0 DS41_ENGRAM_SPIN_US=2000; do
    env $v "$DS41" run -m "$tiny" --prompt-ids "$P" -n 12 --exact --ignore-eos --spec off --engram-mode prefetch \
        --dump-logits "$TMP/$v.f32" >"$TMP/$v.txt" 2>"$TMP/$v.err" || { fail run_$v "$(tail -n 2 "$TMP/$v.err")"; }
done
if cmp -s "$TMP/ram.txt" "$TMP/mmap.txt" && cmp -s "$TMP/prefetch.txt" "$TMP/mmap.txt" &&
   cmp -s "$TMP/ram.f32" "$TMP/mmap.f32" && cmp -s "$TMP/prefetch.f32" "$TMP/mmap.f32" && [ -s "$TMP/mmap.f32" ] &&
   cmp -s "$TMP/DS41_ENGRAM_SPLIT=0.f32" "$TMP/mmap.f32" && cmp -s "$TMP/DS41_ENGRAM_SPIN_US=2000.f32" "$TMP/mmap.f32" &&
   cmp -s "$TMP/DS41_ENGRAM_SPLIT=0.txt" "$TMP/mmap.txt" && cmp -s "$TMP/DS41_ENGRAM_SPIN_US=2000.txt" "$TMP/mmap.txt"; then
    pass run_identity_tiny
else fail run_identity_tiny "tokens or logits differ between ram, mmap and prefetch (split or not, spinning or not)"; fi
if grep -q "rows prefetched per step" "$TMP/prefetch.err" && grep -q "prefetch through io_uring\|prefetch through pread" "$TMP/prefetch.err" &&
   grep -q "in RAM (anonymous memory)" "$TMP/ram.err"; then pass startup_lines
else fail startup_lines "$(cat "$TMP/prefetch.err" "$TMP/ram.err")"; fi

# ---- bench line
"$DS41" bench -m "$tiny" --lengths 32 --decode 4 --modes ced --engram-mode prefetch >"$TMP/bench.txt" 2>/dev/null
if grep -Eq "^engram prefetch \((io_uring|pread)\): [0-9]+ steps, [0-9]+ distinct rows, row cache hit rate [0-9.]+ %.* [1-9][0-9]* bytes read from disk, stall [0-9.]+ ms per step" "$TMP/bench.txt"; then
    pass bench_engram_line
else fail bench_engram_line "$(tail -n 3 "$TMP/bench.txt")"; fi

# ---- bench --engram: the step timeline (time in the issue, layers before the first wait) is
# counted under prefetch and is exactly zero without it (no step is issued)
"$DS41" bench --engram -m "$tiny" --prompt 4 -n 8 --engram-mode prefetch --json >"$TMP/bep.json" 2>/dev/null
"$DS41" bench --engram -m "$tiny" --prompt 4 -n 8 --engram-mode ram --json >"$TMP/ber.json" 2>/dev/null
"$DS41" bench --engram -m "$tiny" --prompt 4 -n 8 --engram-mode prefetch >"$TMP/bep.txt" 2>/dev/null
if "$PY" - "$TMP/bep.json" "$TMP/ber.json" <<'PYEOF'
import json, sys
p, r = (json.load(open(f)) for f in sys.argv[1:3])
ok = p["mode"] == "prefetch" and p["issue_ms_per_token"] > 0 and p["lead_ms_per_token"] > 0 and p["stall_ms_per_token"] >= 0
ok = ok and r["mode"] == "ram" and r["issue_ms_per_token"] == 0 and r["lead_ms_per_token"] == 0
sys.exit(0 if ok else 1)
PYEOF
then
    if grep -Eq "^engram step timeline, ms per token: issue [0-9.]+ .* layers until the first Engram layer's wait [0-9.]+, waits [0-9.]+$" "$TMP/bep.txt"; then
        pass bench_engram_timeline
    else fail bench_engram_timeline "no timeline line: $(tail -n 2 "$TMP/bep.txt")"; fi
else fail bench_engram_timeline "$(cat "$TMP/bep.json" "$TMP/ber.json")"; fi

# ---- /metrics
sck=$(serve_checkpoint) || exit 1
if serve_start metrics -m "$sck" --engram-mode prefetch --engram-cache 16K; then
    curl -s -m 20 -d '{"prompt":[5,6,7,8],"max_tokens":4}' "http://127.0.0.1:$PORT/v1/completions" >/dev/null
    curl -s -m 10 "http://127.0.0.1:$PORT/metrics" >"$TMP/metrics"
    kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null
    look=$(sed -n 's/^ds41:engram_row_lookups_total{[^}]*} \([0-9]*\)$/\1/p' "$TMP/metrics")
    cb=$(sed -n 's/^ds41:engram_row_cache_bytes{[^}]*} \([0-9]*\)$/\1/p' "$TMP/metrics")
    if [ -n "$look" ] && [ "$look" -gt 0 ] && [ "$cb" = 16368 ] &&
       grep -q '^ds41:engram_row_cache_hits_total{' "$TMP/metrics" && grep -q '^ds41:engram_bytes_read_total{' "$TMP/metrics" &&
       grep -q '^ds41:engram_stall_seconds_total{' "$TMP/metrics"; then
        pass metrics_engram
    else fail metrics_engram "lookups '$look', cache bytes '$cb' (16368 = 496 rows of 33 bytes): $(grep engram "$TMP/metrics" | head -n 5)"; fi
fi

# ---- cgroup v1 memory limit smaller than the tables
V1=/sys/fs/cgroup/memory
if [ "$(id -u)" != 0 ]; then
    echo "SKIP cgroup_limit: not root (a cgroup needs root)"
elif [ -n "${DS41_ASAN:-}" ]; then
    # ASan's shadow memory and quarantine do not fit a 48 MiB limit (the OOM killer ends the
    # prefetch run); the limit runs are in the normal pass, the modes' code is checked above
    echo "SKIP cgroup_limit: under the sanitizers"
elif [ ! -w "$V1/cgroup.procs" ] && [ ! -f "$V1/memory.limit_in_bytes" ]; then
    echo "SKIP cgroup_limit: no cgroup v1 memory controller at $V1"
else
    big=$(checkpoint tiny-bigengram) || exit 1
    CG=$V1/ds41-engram-test-$$
    LIMIT=$((48 << 20))
    if ! mkdir "$CG" 2>"$TMP/err" || ! echo $LIMIT >"$CG/memory.limit_in_bytes" 2>>"$TMP/err"; then
        echo "SKIP cgroup_limit: cannot create a memory cgroup: $(cat "$TMP/err")"
    else
        # in the cgroup: a shell moves itself in, then becomes ds41
        incg() { sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' incg "$CG" "$@"; }
        tables=$(stat -c %s "$big/model.safetensors")   # the file: 99 MB of tables, 5 MB of the rest
        "$DS41" run -m "$big" --prompt-ids "$P" -n 12 --exact --ignore-eos --spec off --engram-mode ram \
            --dump-logits "$TMP/cg-ram.f32" >"$TMP/cg-ram.txt" 2>"$TMP/cg-ram.err"
        # the checkpoint's pages leave the page cache, so that what the runs read is charged here
        evict() { "$PY" -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$big/model.safetensors"; }
        # ram cannot fit: the limit must stop it (the kernel's OOM killer inside the cgroup)
        evict
        incg "$DS41" run -m "$big" --prompt-ids "$P" -n 2 --exact --spec off --engram-mode ram >/dev/null 2>"$TMP/cg-ramin.err"
        st=$?
        if [ "$tables" -le $((2 * LIMIT)) ]; then fail cgroup_limit_bites "the checkpoint ($tables B) is not twice the limit"
        elif [ $st = 137 ]; then pass cgroup_limit_bites
        else fail cgroup_limit_bites "ram mode inside a limit smaller than its tables: exit $st, not killed: $(tail -n 2 "$TMP/cg-ramin.err")"; fi
        echo 0 >"$CG/memory.max_usage_in_bytes"   # from here the peak of the runs that fit
        for m in prefetch mmap auto; do
            evict
            incg "$DS41" run -m "$big" --prompt-ids "$P" -n 12 --exact --ignore-eos --spec off --engram-mode $m \
                --engram-cache 4M --dump-logits "$TMP/cg-$m.f32" >"$TMP/cg-$m.txt" 2>"$TMP/cg-$m.err"
        done
        peak=$(cat "$CG/memory.max_usage_in_bytes")
        ok=1
        for m in prefetch mmap auto; do
            if ! cmp -s "$TMP/cg-$m.txt" "$TMP/cg-ram.txt" || ! cmp -s "$TMP/cg-$m.f32" "$TMP/cg-ram.f32" || [ ! -s "$TMP/cg-ram.f32" ]; then
                ok=0; fail cgroup_limit_$m "tokens or logits differ from ram outside the limit: $(tail -n 2 "$TMP/cg-$m.err")"
            fi
        done
        [ $ok = 1 ] && pass cgroup_limit_identity
        echo "  checkpoint $tables B, limit $LIMIT B, peak usage of the runs $peak B"
        if grep -q "rows prefetched per step (auto)" "$TMP/cg-auto.err" && grep -q "memory cgroup" "$TMP/cg-auto.err"; then
            pass cgroup_auto_picks_prefetch
        else fail cgroup_auto_picks_prefetch "$(head -n 3 "$TMP/cg-auto.err")"; fi
        if grep -q "warning: the weights .* exceed the memory available" "$TMP/cg-mmap.err"; then pass cgroup_mmap_warns
        else fail cgroup_mmap_warns "$(head -n 3 "$TMP/cg-mmap.err")"; fi
    fi
fi
