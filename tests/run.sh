#!/usr/bin/env bash
# Runs every test program and prints the total as its last line: "N passed, N failed".
# A test program prints "PASS name" / "FAIL name: why" lines; a program that exits non-zero
# without printing a FAIL line counts as one failure.
#   build/tests/test_*        C unit and conformance tests
#   tests/*.test.sh           CLI / end-to-end tests (get $DS41 = the binary to drive)
#   tests/*_test.py           Python-side tests (Debian's python3 with numpy), skipped under ASan
set -u
cd "$(dirname "$0")/.."
BUILD=${DS41_BUILD:-build}
export DS41="$PWD/$BUILD/ds41"
export DS41_ROOT="$PWD"
export PYTHON=/usr/bin/python3
# caches the commands write (the verify-width curves of --spec auto) stay in the build tree,
# one per build (so the sanitizer run and the normal one never share a file)
export XDG_CACHE_HOME="$PWD/$BUILD/test-cache"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
filter=${DS41_TEST_FILTER:-}
# Under the sanitizers (make check-asan inside make test) a representative subset, to keep make
# test under 15 minutes on 2 cores: the programs listed in tests/asan-skip (with the reasons) are
# skipped there, and the Makefile does not build their test binaries with the sanitizers.
# DS41_ASAN_SKIP="" runs everything.
asan_skip=${DS41_ASAN_SKIP-$(sed 's/#.*//' tests/asan-skip)}
skipped() {
    [ -n "${DS41_ASAN:-}" ] || return 1
    local n
    for n in $asan_skip; do [ "$(basename "$1")" = "$n" ] && return 0; done
    return 1
}
mkdir -p "$BUILD/test-logs"
pass=0 fail=0 prep_wait=""
run_one() {
    local name=$1; shift
    local log="$BUILD/test-logs/$(basename "$name").log"
    # bash's time: the wall seconds and the CPU seconds (user + system) of the program and of
    # the processes it waited for; on a shared machine the CPU seconds compare runs, the wall
    # seconds do not
    local rc tm TIMEFORMAT='%R %U %S'
    { time "$@" >"$log" 2>&1 </dev/null; } 2>"$log.time"   # stdin: not the test list (mpiexec forwards its stdin to rank 0)
    rc=$?
    tm=$(tail -n 1 "$log.time")
    rm -f "$log.time"
    local p=$(grep -c '^PASS ' "$log")
    local f=$(grep -c '^FAIL ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1
        echo "FAIL $name: exited with status $rc" >>"$log"
    fi
    pass=$((pass + p)); fail=$((fail + f))
    set -- $tm
    printf '%-40s %4d passed %3d failed  %6.1fs %6.1fs cpu\n' "$(basename "$name")" "$p" "$f" "${1:-0}" "$(echo "${2:-0} + ${3:-0}" | bc)"
    if [ "$f" -ne 0 ]; then grep -E '^(FAIL|  )' "$log" | head -n 40 | sed 's/^/    /'; tail -n 5 "$log" | sed 's/^/    | /'; fi
}
# The list of test programs, in the order they print.
all_tests() {
    local t
    for t in "$BUILD"/tests/test_*; do [ -x "$t" ] && echo "$t"; done
    for t in tests/*.test.sh; do [ -f "$t" ] && echo "$t"; done
    if [ -z "${DS41_ASAN:-}" ]; then for t in tests/*_test.py; do [ -f "$t" ] && echo "$t"; done; fi
}
# run_list FILE: runs the tests listed in FILE; the totals go to FILE.totals
run_list() {
    local t
    while read -r t; do
        case "$t" in *"$filter"*) ;; *) continue ;; esac
        skipped "$t" && continue
        # the two programs that read build/test-ck/conf-prodslice wait for its background writer
        case "$(basename "$t")" in
            run.test.sh|conformance.test.sh)
                if [ -n "$prep_wait" ]; then
                    while [ ! -e "$prep_wait" ]; do sleep 0.05; done
                    grep -h '^FAIL' "$BUILD/test-logs/prodslice.out" && fail=$((fail + 1))
                    prep_wait=""
                fi ;;
        esac
        case "$t" in
            *.test.sh) run_one "$t" bash "$t" ;;
            *_test.py) run_one "$t" "$PYTHON" "$t" ;;
            *) run_one "$t" "$t" ;;
        esac
    done <"$1"
    echo "$pass $fail" >"$1.totals"
}
# Two lanes on machines with two or more cores (not inside the sanitizer run, which is itself
# in a lane): lane A runs the long sequential programs named in DS41_LANE_A in the background
# (its lines are printed when it ends), lane B everything else. The checkpoints the shell tests
# share (build/test-ck) are written first, so the lanes never write the same files.
# DS41_TEST_JOBS=1 runs one lane.
# (a clean-clone run on a 2-core AMD EPYC at 1d7b275 + pipe23: the ASan run 543 s, conformance
# 155 s, pd 61 s, store_faults 26 s, configs 10 s, 795 s in all, against 833 s for everything
# else, with mpi.test.sh 134 s, demo_model 106 s, fuzz 105 s and tokenizer 54 s; tokenizer.test.sh
# moved here and 55 s taken out of the ASan run, so about 775 s against 780 s. At 41dd6b3: lane A
# 738 s (the ASan run 419 s), lane B 756 s; trim29 takes about 60 s out of the ASan run (its
# build at -g1 without the skipped programs' binaries, test_kernels' doubled ISA loop, the
# checkpoint cache) and about 30 s out of lane B (the cache, the fuzz build at -g1), and moves
# train_resume_test.py (25 s) here: about 705 s against 705 s. A clean clone of f662d14 on an
# AVX2-only 2-core EPYC: lane A 699 s, lane B 753 s (mpi.test.sh 139 s, test_batch 136 s, fuzz 89 s);
# test_spec (24 s) moved here: about 723 s against 729 s)
lane_a=${DS41_LANE_A-sanitizers.test.sh conformance.test.sh pd.test.sh store_faults.test.sh configs.test.sh tokenizer.test.sh train_resume_test.py test_spec}
jobs=${DS41_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
all_tests >"$BUILD/test-logs/list"
if [ -z "${DS41_ASAN:-}" ] && [ "$jobs" -gt 1 ] && [ -n "$lane_a" ]; then
    : >"$BUILD/test-logs/list.a"; : >"$BUILD/test-logs/list.b"
    while read -r t; do
        in_a=0
        for n in $lane_a; do [ "$(basename "$t")" = "$n" ] && in_a=1; done
        [ $in_a = 1 ] && echo "$t" >>"$BUILD/test-logs/list.a" || echo "$t" >>"$BUILD/test-logs/list.b"
    done <"$BUILD/test-logs/list"
    # lane A starts with the sanitizer pass (its ASan build needs no checkpoint) while the
    # production-width slice is written
    { grep '/sanitizers.test.sh$' "$BUILD/test-logs/list.a"; grep -v '/sanitizers.test.sh$' "$BUILD/test-logs/list.a"; } \
        >"$BUILD/test-logs/list.a2"
    mv "$BUILD/test-logs/list.a2" "$BUILD/test-logs/list.a"
    DS41_BUILD=$BUILD PREPARE=small bash tests/prepare.sh || echo "FAIL prepare: shared test checkpoints could not be written"
    # the production-width slice (about 45 s of writing 4.9 GB) in the background, beside the C
    # unit tests and the ASan build; run_list waits for it before the two programs that read it
    rm -f "$BUILD/test-logs/prodslice.done"
    { DS41_BUILD=$BUILD PREPARE=prodslice bash tests/prepare.sh || echo "FAIL prepare: the prodslice checkpoint could not be written"
      : >"$BUILD/test-logs/prodslice.done"; } >"$BUILD/test-logs/prodslice.out" 2>&1 &
    prep_wait=$BUILD/test-logs/prodslice.done
    run_list "$BUILD/test-logs/list.a" >"$BUILD/test-logs/lane-a.out" 2>&1 &
    lane_pid=$!
    run_list "$BUILD/test-logs/list.b"
    wait "$lane_pid"
    cat "$BUILD/test-logs/lane-a.out"
    read -r pa fa <"$BUILD/test-logs/list.a.totals" || { pa=0; fa=1; }
    read -r pb fb <"$BUILD/test-logs/list.b.totals" || { pb=0; fb=1; }
    pass=$((pa + pb)); fail=$((fa + fb))
else
    run_list "$BUILD/test-logs/list"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
