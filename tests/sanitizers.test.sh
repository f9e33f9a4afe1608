#!/usr/bin/env bash
# Part of make test: rebuilds the tree with AddressSanitizer + UndefinedBehaviorSanitizer
# (make check-asan) and runs the C and CLI tests under it (the libFuzzer smoke run is
# tests/fuzz.test.sh, in the other lane). Prints the inner PASS/FAIL lines, prefixed.
# DS41_SKIP_SANITIZERS=1 skips it (for quick local runs); inside the ASan run it is a no-op.
set -u
cd "$DS41_ROOT"
[ -n "${DS41_ASAN:-}" ] && exit 0
if [ -n "${DS41_SKIP_SANITIZERS:-}" ]; then echo "sanitizers skipped (DS41_SKIP_SANITIZERS)" >&2; exit 0; fi
log=build/test-logs/check-asan.out
make --no-print-directory -j"$(nproc)" check-asan >"$log" 2>&1
rc=$?
grep -E '^(PASS|FAIL) ' build-asan/test-logs/*.log 2>/dev/null | sed -E 's/^build-asan\/test-logs\/([^:]*)\.log:(PASS|FAIL) /\2 asan:\1:/'
if [ "$rc" -ne 0 ] && ! grep -q '^FAIL' build-asan/test-logs/*.log 2>/dev/null; then
    echo "FAIL asan: make check-asan exited $rc"; tail -n 20 "$log"
fi
