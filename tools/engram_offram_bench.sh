#!/usr/bin/env bash
# Engram off RAM (P4) measurement, not part of make test (docs/engram-offram.md).
#
#   tools/engram_offram_bench.sh CKPT TEXT [ROUNDS] [STEPS] [LIMIT_MIB]
#
# CKPT: a checkpoint whose Engram tables are at least 4x LIMIT (docs/engram-offram.md says how
# the measured one was written); TEXT: the text decoded teacher-forced (the demo model's
# held-out split). Each round runs every mode of MODES (default: mmap prefetch
# prefetch_buffered ram) once, as separate processes, the order rotated by one mode per round
# (so each mode runs first, second, ... equally often and each ratio compares neighbours in
# time); prefetch_spin is prefetch with DS41_ENGRAM_SPIN_US=1000. mmap and prefetch (O_DIRECT;
# prefetch_buffered: DS41_ENGRAM_DIRECT=0) run inside a
# fresh cgroup v1 memory limit of LIMIT MiB each, ram outside it (the tables do not fit the
# limit). Before mmap and buffered runs the checkpoint's pages are dropped from the page cache
# (posix_fadvise DONTNEED on the file), so they start with the tables on disk; O_DIRECT reads
# bypass the page cache and ram reads the whole file at load, so those run without the drop
# (ram's load then costs a copy, not a 4 GB read). Then, unless HIT=0, one longer prefetch run
# per row-cache size for the hit rate on the text. Prints one JSON line per run (ds41 bench
# --engram --json, with the load average at its start), the medians per mode and the per-round
# ratios to ram. ARGS: more ds41 bench options for every run (e.g. ARGS="-t 2 --prompt 128"). Needs
# root (the cgroup).
set -u
CK=${1:?checkpoint dir}
TEXT=${2:?text file}
ROUNDS=${3:-3}
STEPS=${4:-400}
LIMIT_MIB=${5:-1000}
cd "$(dirname "$0")/.."
DS41=${DS41:-./build/ds41}
PY=/usr/bin/python3
OUT=$(mktemp -d /tmp/ds41-egbench.XXXXXX)
MODES=${MODES:-mmap prefetch prefetch_buffered ram}
CGN=0
CG=
cleanup() { for d in /sys/fs/cgroup/memory/ds41-egbench-$$-*; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done; rm -rf "$OUT"; }
trap cleanup EXIT
newcg() {   # a fresh cgroup per run: nothing an earlier run left charged counts against the next
    [ -n "$CG" ] && rmdir "$CG" 2>/dev/null
    CGN=$((CGN + 1))
    CG=/sys/fs/cgroup/memory/ds41-egbench-$$-$CGN
    mkdir "$CG" && echo $((LIMIT_MIB << 20)) >"$CG/memory.limit_in_bytes" || { echo "cannot create $CG" >&2; exit 1; }
}
evict() { "$PY" -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$CK/model.safetensors"; }
incg() { sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' incg "$CG" "$@"; }
run() {   # run NAME IN_CGROUP EVICT ARGS...
    local name=$1 cg=$2 ev=$3 load; shift 3
    [ "$ev" = 1 ] && evict
    load=$(cut -d' ' -f1 /proc/loadavg)
    if [ "$cg" = 1 ]; then newcg; incg env ${ENVSET:-X=1} "$DS41" bench --engram -m "$CK" --text "$TEXT" --json ${ARGS:-} "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
    else "$DS41" bench --engram -m "$CK" --text "$TEXT" --json ${ARGS:-} "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"; fi
    local st=$?
    if [ $st -ne 0 ]; then echo "{\"run\":\"$name\",\"failed\":$st}"; tail -n 2 "$OUT/$name.err" >&2; return; fi
    sed "s/^{/{\"run\":\"$name\",\"load1\":$load,\"cgroup_mib\":$([ "$cg" = 1 ] && echo "$LIMIT_MIB" || echo 0),/" "$OUT/$name.json"
}
echo "# $(date -u) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); checkpoint $(du -b "$CK/model.safetensors" | cut -f1) B, limit $LIMIT_MIB MiB${ARGS:+, bench options $ARGS}"
set -- $MODES
NM=$#
for r in $(seq 1 "$ROUNDS"); do
    for k in $(seq 0 $((NM - 1))); do
        eval "m=\${$(( (r - 1 + k) % NM + 1 ))}"
        case $m in
        mmap) run "mmap-$r" 1 1 -n "$STEPS" --engram-mode mmap ;;
        prefetch) run "prefetch-$r" 1 0 -n "$STEPS" --engram-mode prefetch ;;
        prefetch_buffered) ENVSET=DS41_ENGRAM_DIRECT=0 run "prefetch_buffered-$r" 1 1 -n "$STEPS" --engram-mode prefetch ;;
        prefetch_spin) ENVSET=DS41_ENGRAM_SPIN_US=1000 run "prefetch_spin-$r" 1 0 -n "$STEPS" --engram-mode prefetch ;;
        ram) run "ram-$r" 0 0 -n "$STEPS" --engram-mode ram ;;
        *) echo "unknown mode $m in MODES" >&2; exit 2 ;;
        esac
    done
done | tee "$OUT/rounds.jsonl"
if [ "${HIT:-1}" != 0 ]; then
    echo "# hit rate of the row cache on the text, by cache size (prefetch, in the cgroup, $((STEPS * 8)) steps)"
    for c in 16M 64M 256M; do
        run "hit-$c" 1 1 -n $((STEPS * 8)) --engram-mode prefetch --engram-cache $c
    done
fi
"$PY" - "$OUT/rounds.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    if "failed" in r: continue
    by.setdefault(r["run"].split("-")[0], []).append(r)
med = lambda m, k: statistics.median(x[k] for x in by[m])
print("# medians over rounds: mode, decode tok/s, step median ms, p99 ms, rows read/token, bytes read/token, storage bytes/token, major faults/token, hit rate, stall ms/token, issue ms/token, lead ms/token (layers before the first Engram wait)")
for m in ("mmap", "prefetch", "prefetch_buffered", "prefetch_spin", "ram"):
    if m in by:
        print("%-17s %8.2f %8.3f %8.3f %8.2f %9.0f %9.0f %7.3f %6.3f %7.3f %7.3f %7.3f" % (m, med(m, "decode_tok_s"), med(m, "step_median_ms"),
              med(m, "step_p99_ms"), med(m, "rows_read_per_token"), med(m, "bytes_read_per_token"), med(m, "disk_bytes_per_token"),
              med(m, "major_faults_per_token"), med(m, "hit_rate"), med(m, "stall_ms_per_token"),
              med(m, "issue_ms_per_token"), med(m, "lead_ms_per_token")))
if "ram" in by:
    # per-round ratios (the rounds are interleaved, so each ratio compares neighbours in time)
    rounds = {}
    for r in rows:
        if "failed" not in r and not r["run"].startswith("hit"): rounds.setdefault(r["run"].split("-")[1], {})[r["run"].split("-")[0]] = r["decode_tok_s"]
    for m in ("mmap", "prefetch", "prefetch_buffered", "prefetch_spin"):
        rs = [v[m] / v["ram"] for v in rounds.values() if m in v and "ram" in v]
        if rs:
            q = sorted(rs)
            at = lambda p: q[min(len(q) - 1, int(p * len(q)))]
            print("# %s / ram decode tok/s: median of %d per-round ratios %.3f, quartiles %.3f-%.3f, range %.3f-%.3f (rounds: %s)"
                  % (m, len(rs), statistics.median(rs), at(0.25), at(0.75), q[0], q[-1], " ".join("%.3f" % x for x in rs)))
    loads = [r["load1"] for r in rows if "load1" in r]
    if loads: print("# load average (1 min) at the runs' starts: median %.1f, range %.1f-%.1f" % (statistics.median(loads), min(loads), max(loads)))
EOF
