#!/usr/bin/env bash
# Runs every libFuzzer harness build-fuzz/fuzz_* for SECONDS (default 20) each.
#   fuzz/run.sh [SECONDS]
# Seeds: fuzz/corpus/<name>/ is copied to a fresh scratch corpus build-fuzz/work/<name>/corpus
# (the fuzzer adds to the copy, never to the committed seeds); fuzz/<name>.dict is used when
# present. Crash, leak, timeout and out-of-memory reproducers land in build-fuzz/work/<name>/.
# Prints one PASS/FAIL line per harness; exits non-zero if any harness failed.
set -u
cd "$(dirname "$0")/.."
secs=${1:-20}
case "$secs" in ''|*[!0-9]*) echo "fuzz/run.sh: SECONDS must be a whole number, got '$secs'" >&2; exit 2 ;; esac
ran=0 failed=0
for bin in build-fuzz/fuzz_*; do
    [ -f "$bin" ] && [ -x "$bin" ] || continue
    name=$(basename "$bin")
    work=build-fuzz/work/$name
    rm -rf "$work"
    mkdir -p "$work/corpus" "$work/artifacts"
    if [ -d "fuzz/corpus/$name" ]; then cp -R "fuzz/corpus/$name/." "$work/corpus/"; fi
    dict=()
    if [ -f "fuzz/$name.dict" ]; then dict=("-dict=fuzz/$name.dict"); fi
    nseeds=$(find "$work/corpus" -type f | wc -l)
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 -artifact_prefix="$work/artifacts/" "${dict[@]}" "$work/corpus" \
        >"$work/log" 2>&1
    rc=$?
    ran=$((ran + 1))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)
    arts=$(find "$work/artifacts" -type f | wc -l)
    if [ "$rc" -ne 0 ] || [ "$arts" -ne 0 ]; then
        failed=$((failed + 1))
        echo "FAIL $name: exit status $rc, $arts reproducer(s) in $work/artifacts (log: $work/log)"
        grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$work/log" | head -n 15 | sed 's/^/    /'
    else
        echo "PASS $name: ${runs:-?} runs in ${secs}s from $nseeds seeds, corpus now $(find "$work/corpus" -type f | wc -l) inputs"
    fi
done
if [ "$ran" -eq 0 ]; then
    echo "fuzz/run.sh: no harness found (build-fuzz/fuzz_*); run 'make fuzz'" >&2
    exit 1
fi
echo "$((ran - failed)) fuzz harnesses passed, $failed failed"
[ "$failed" -eq 0 ]
