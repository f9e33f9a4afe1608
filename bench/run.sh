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

exit $status
