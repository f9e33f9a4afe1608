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
RES=${DS41_BENCH_RESULTS:-build/bench-results}   # the saved results bench/plot.py draws (plots block)
mkdir -p "$RES"
"${DS41_BUILD:-build}"/bench/bench_kernels ${DS41_BENCH_QUICK:+--quick} | tee "$RES/kernels.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
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
# DS41_BENCH_THREADS (default 2) threads, fast kernels; --profile: where a decode step's time goes
# (weight streams per format against a read-bandwidth probe, the parts of the model, sampling). A checkpoint written here minutes ago is
# measured in its steady state: ds41 bench --settle auto (the default) writes back, evicts and
# re-reads shards younger than 10 minutes first (mmap decode ran 2.4-2.6x slower on the pages the
# writer left) and its first line says which state it measured.
echo "== model"
T=${DS41_BENCH_THREADS:-2}
for spec in "small43 tests/configs/small43 256,1024,4096 16" "prodwidth4 bench/configs/prodwidth4 64,256 8"; do
    set -- $spec
    ck=build/bench-ck/$1
    if [ ! -f "$ck/.complete" ] || ! cmp -s "$ck/config.json" "$2/config.json"; then
        rm -rf "$ck"
        /usr/bin/python3 tools/make_checkpoint.py "$2" "$ck" --seed 1 --token-map stub --shards 4 -q && touch "$ck/.complete" || { status=1; continue; }
    fi
    echo "-- ds41 bench -m $ck --lengths $3 --decode $4 -t $T --profile"
    "${DS41_BUILD:-build}"/ds41 bench -m "$ck" --lengths "$3" --decode "$4" -t "$T" --settle auto --profile || status=1
done
# ---- end model ------------------------------------------------------------------------------

# ---- plots (bench/plot.py): kernels vs the machine, prefill ced vs full, serving vs concurrency --
# Saves JSON into $RES (build/bench-results): ds41 bench --json prefill curves (demo 32..1024;
# small43 256..4096), ds41 bench-serve --json at concurrency 1,4,16 against ds41 serve on the
# demo model (a port the kernel picks); then draws docs/img/*.png from $RES with Debian's
# matplotlib (DS41_BENCH_IMG to write elsewhere). Redraw saved results: bench/plot.py DIR OUT.
echo "== plots"
"${DS41_BUILD:-build}"/ds41 bench -m models/demo --lengths 32,64,128,256,512,1024 --decode 8 -t "$T" --json \
    >"$RES/prefill-demo.json" || status=1
[ -f build/bench-ck/small43/.complete ] && { "${DS41_BUILD:-build}"/ds41 bench -m build/bench-ck/small43 \
    --lengths 256,512,1024,2048,4096 --decode 4 -t "$T" --json >"$RES/prefill-small43.json" || status=1; }
slog=$(mktemp /tmp/ds41-bench-serve.XXXXXX)
"${DS41_BUILD:-build}"/ds41 serve -m models/demo --port 0 -t "$T" --parallel 16 >"$slog" 2>&1 &
spid=$!
port=
for _ in $(seq 1 300); do
    port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$slog"); [ -n "$port" ] && break
    kill -0 $spid 2>/dev/null || break; sleep 0.1
done
if [ -n "$port" ]; then
    "${DS41_BUILD:-build}"/ds41 bench-serve --port "$port" --concurrency 1,4,16 --input-len 128 --output-len 64 --json \
        >"$RES/serve-demo.jsonl" || status=1
else
    echo "bench: ds41 serve did not start: $(tail -n 3 "$slog")" >&2; status=1
fi
kill $spid 2>/dev/null; wait $spid 2>/dev/null; rm -f "$slog"
/usr/bin/python3 bench/plot.py "$RES" "${DS41_BENCH_IMG:-docs/img}" || status=1
# ---- end plots ------------------------------------------------------------------------------

exit $status
