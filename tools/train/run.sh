#!/usr/bin/env bash
# The whole demo-model pipeline, as it produced models/demo (make train-demo).
#   1. corpus: documents from the Debian packages, 2 % held out, chat renderings (8 s)
#   2. tokenizer: byte-level BPE on the training split (27 s) -- only with RETRAIN_TOKENIZER=1:
#      the committed models/demo/tokenizer.json is what the weights were trained with
#   3. token files (23 s) and the Engram token map (ds41 tokenize --engram-map)
#   4. training, two single-threaded data-parallel workers, seeded, resumable: a run that was
#      stopped (Ctrl-C, a reboot, MINUTES=M) continues from build/demo-train/state.pt the next
#      time (FRESH=1 starts over); MINUTES=60 trains for an hour of this sitting, then saves
#   5. export to models/demo/model.safetensors (release formats) and the loss plot
# Steps can be overridden: the defaults train one epoch (about 6 hours on 2 cores: MINUTES=M per sitting;
# tools/train/README.md "One epoch"); models/demo's text model is the shorter run of its MODEL_CARD.md
# (DENSE=30 SPARSE=230 QAT=20 DSPARK=50, about 45 minutes); TRAIN_ARGS="..."
# adds train.py options (e.g. "--draft-positions 64 --draft-ce 0.2 --draft-kl 0.8", the drafter settings).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3
OUT=${OUT:-build/demo-train}
$PY tools/train/corpus.py build
if [ "${RETRAIN_TOKENIZER:-0}" = 1 ]; then $PY tools/train/bpe.py; fi
$PY tools/train/corpus.py tokenize
[ -f models/demo/engram_token_map.i32 ] || ./ds41 tokenize -m models/demo --engram-map >/dev/null
mkdir -p "$OUT"
if [ "${FRESH:-0}" = 1 ]; then rm -f "$OUT/state.pt" "$OUT/log.jsonl"; fi
resume=
if [ -f "$OUT/state.pt" ]; then resume=--resume; echo "make train-demo: continuing from $OUT/state.pt (FRESH=1 starts over)"; fi
rc=0
$PY tools/train/train.py --data build/demo-data --out "$OUT" \
    --dense "${DENSE:-30}" --sparse "${SPARSE:-2100}" --qat "${QAT:-40}" --dspark "${DSPARK:-300}" \
    --batch 8 --procs 2 --lr 3e-3 --warmup 30 --eval-every 100 --save-every "${SAVE_EVERY:-10}" $resume \
    ${MINUTES:+--stop-after-minutes "$MINUTES"} ${TRAIN_ARGS:-} 2>&1 | tee -a "$OUT/train.log" || rc=$?
if [ "$rc" = 3 ]; then
    echo "make train-demo: stopped and saved; run make train-demo again to continue"
    exit 0
fi
[ "$rc" = 0 ] || exit "$rc"
$PY tools/train/export.py --state "$OUT/state.pt" --out models/demo --released "$OUT/released.pt"
cp "$OUT/loss.png" models/demo/loss.png
