#!/usr/bin/env bash
# `make bench`: every benchmark section in turn. Each section is a clearly marked block owned
# by one part of the project; add yours as another block. Speed is only measured here, never
# asserted by a test.
set -u
cd "$(dirname "$0")/.."
status=0

# ---- tokenizer (bench/tokenizer.sh): encode MB/s, ds41 vs Hugging Face tokenizers -------------
echo "== tokenizer"
bash bench/tokenizer.sh || status=1
# ---- end tokenizer --------------------------------------------------------------------------

# ---- kernels (bench/bench_kernels.c): fast linears at production shapes vs the machine ---------
# Read bandwidth, FMA peak, clock and empty parallel_for first; then ms/call, weight GB/s and
# GMAC/s of each linear for T = 1, 8, 64 and 1, 2 threads (decode: compare GB/s with the read
# bandwidth; prefill: GMAC/s with the FMA peak). About a minute; DS41_BENCH_QUICK=1 halves it.
echo "== kernels"
"${DS41_BUILD:-build}"/bench/bench_kernels ${DS41_BENCH_QUICK:+--quick} || status=1
# ---- end kernels ----------------------------------------------------------------------------

exit $status
