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

# ---- store (bench/bench_pstore.c): persistent prefix store put / get of 128-token blocks ---------
# 113920 B (production, 890 B/token) and 10176 B (demo, 79.5 B/token) blocks in build/bench-pstore:
# put = temp file, write, fsync, rename, directory fsync; get = warm read + checksum. Medians.
echo "== store"
"${DS41_BUILD:-build}"/bench/bench_pstore || status=1
# ---- end store ------------------------------------------------------------------------------

# ---- model (ds41 bench): prefill ced vs full, decode, peak RSS, state bytes --------------------
# Checkpoints written once into build/bench-ck/ by tools/make_checkpoint.py (seed 1):
#   small43    the full 43-entry production plan at dim 256 (37 MB)
#   prodwidth4 production width (dim 5120, 64 x 512 heads, vocab 129280), 6 layers + 1 stage,
#              the four KV sources, 4 experts top-2 (about 4.9 GB, about 30 s to write)
# DS41_BENCH_THREADS (default 2) threads, fast kernels.
echo "== model"
T=${DS41_BENCH_THREADS:-2}
for spec in "small43 tests/configs/small43 256,1024,4096 16" "prodwidth4 bench/configs/prodwidth4 64,256 8"; do
    set -- $spec
    ck=build/bench-ck/$1
    if [ ! -f "$ck/.complete" ] || ! cmp -s "$ck/config.json" "$2/config.json"; then
        rm -rf "$ck"
        /usr/bin/python3 tools/make_checkpoint.py "$2" "$ck" --seed 1 --token-map stub --shards 4 -q && touch "$ck/.complete" || { status=1; continue; }
    fi
    echo "-- ds41 bench -m $ck --lengths $3 --decode $4 -t $T"
    "${DS41_BUILD:-build}"/ds41 bench -m "$ck" --lengths "$3" --decode "$4" -t "$T" || status=1
done
# ---- end model ------------------------------------------------------------------------------

exit $status
