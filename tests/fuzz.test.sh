#!/usr/bin/env bash
# Part of make test: runs each libFuzzer harness for a short smoke run (make fuzz, the parsers
# built with clang's coverage instrumentation in build-fuzz) and prints its PASS/FAIL lines,
# prefixed. Split from sanitizers.test.sh so that it runs in the other lane of tests/run.sh.
# DS41_SKIP_SANITIZERS=1 skips it (for quick local runs); inside the ASan run it is a no-op.
set -u
cd "$DS41_ROOT"
[ -n "${DS41_ASAN:-}" ] && exit 0
if [ -n "${DS41_SKIP_SANITIZERS:-}" ]; then echo "fuzz smoke run skipped (DS41_SKIP_SANITIZERS)" >&2; exit 0; fi
mkdir -p build/test-logs
flog=build/test-logs/fuzz.out
make --no-print-directory fuzz FUZZ_SECONDS=${DS41_FUZZ_SECONDS:-3} >"$flog" 2>&1
frc=$?
grep -E '^(PASS|FAIL)|^    ' "$flog" | sed -E 's/^(PASS|FAIL) /\1 fuzz:/'
if [ "$frc" -ne 0 ] && ! grep -q '^FAIL' "$flog"; then
    echo "FAIL fuzz: make fuzz exited $frc"; tail -n 20 "$flog"
fi
