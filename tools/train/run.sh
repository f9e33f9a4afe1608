#!/usr/bin/env bash
# The whole demo-model pipeline, as it produced models/demo (make train-demo).
#   1. corpus: documents from the Debian packages, 2 % held out, chat renderings (8 s)
#   2. tokenizer: byte-level BPE on the training split (27 s) -- only with RETRAIN_TOKENIZER=1:
#      the committed models/demo/tokenizer.json is what the weights were trained with
#   3. token files (23 s) and the Engram token map (ds41 tokenize --engram-map)
#   4. training, two single-threaded data-parallel workers, seeded, resumable (--resume)
#   5. export to models/demo/model.safetensors (release formats) and the loss plot
# Steps can be overridden: DENSE=30 SPARSE=230 QAT=20 DSPARK=50 (the release run).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3
OUT=${OUT:-build/demo-train}
$PY tools/train/corpus.py build
if [ "${RETRAIN_TOKENIZER:-0}" = 1 ]; then $PY tools/train/bpe.py; fi
$PY tools/train/corpus.py tokenize
[ -f models/demo/engram_token_map.i32 ] || ./ds41 tokenize -m models/demo --engram-map >/dev/null
mkdir -p "$OUT"
$PY tools/train/train.py --data build/demo-data --out "$OUT" \
    --dense "${DENSE:-30}" --sparse "${SPARSE:-230}" --qat "${QAT:-20}" --dspark "${DSPARK:-50}" \
    --batch 8 --procs 2 --lr 3e-3 --warmup 30 --eval-every 100 --save-every 50 ${RESUME:+--resume} \
    2>&1 | tee -a "$OUT/train.log"
$PY tools/train/export.py --state "$OUT/state.pt" --out models/demo --released "$OUT/released.pt"
cp "$OUT/loss.png" models/demo/loss.png
