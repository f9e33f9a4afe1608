#!/usr/bin/env bash
# make train-vision: the demo model learns to see (docs/vision.md, "The demo model's tower"), run
# after the text model is final, on whatever models/demo holds. Resumable across sittings.
#   1. the text token files (build/demo-data, as make train-demo writes them) when missing
#   2. vision_train.py --ground-only (OUT/ground, GROUND_STEPS, about 0.2 s a step): the tower alone
#      learns to put each cell's colour, shape, position and count words in its aligned token
#   3. vision_train.py: that tower and the language model (--train-lm, in the release formats) on
#      generated scenes, text windows mixed in; resumable (OUT/vision_state.pt): MINUTES=M trains
#      for M minutes of this sitting, saves and stops; the next run continues (FRESH=1 starts over)
#   4. when its last step (STEPS) is reached: vision_export.py writes OUT/model, a copy of
#      models/demo with the tower and the changed text tensors (every other tensor's bytes kept)
#   5. the DSpark stages retrained on the changed backbone (train.py --init-release OUT/model,
#      DSPARK_MINUTES of wall time), merged into OUT/model by dspark_swap.py (DSPARK_MINUTES=0 skips)
#   6. the figures: vision_eval.py through the library and through ds41 run --chat (200 held-out scenes), ds41 perplexity on the
#      held-out text (before / after), dspark_accept.py (before / after) -> OUT/figures.txt
# INSTALL=1 then copies OUT/model into models/demo (the model card's figures are then to be updated).
# CONTINUE=1: a continuation of the tower and backbone BASE ships (tools/train/README.md, "Continuing
# the shipped tower"): no ground phase, the tower read from BASE, both rates on a cosine to 5 % of
# theirs over STEPS (default 600), LM_LR 2.5e-4, LR 5e-4, COUNT_SHARE 0.6, OUT build/demo-vision-cont.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3
BASE=${BASE:-models/demo}
if [ "${CONTINUE:-0}" = 1 ]; then
    OUT=${OUT:-build/demo-vision-cont}
    STEPS=${STEPS:-600}
    INIT_TOWER=$BASE
    LM_LR=${LM_LR:-2.5e-4} LR=${LR:-5e-4} COUNT_SHARE=${COUNT_SHARE:-0.6}
    DECAY="--decay-from 0 --lr-final 0.05"
else
    OUT=${OUT:-build/demo-vision}
    STEPS=${STEPS:-1950}     # the first run's last step (models/demo/MODEL_CARD.md, "Vision"); about 2.4 s a step
    DECAY=
fi
GROUND_STEPS=${GROUND_STEPS:-600}
INIT_TOWER=${INIT_TOWER:-$OUT/ground/vision_state.pt}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1   # one thread: 3 s a step; two threads took 11 (small matrices)
mkdir -p "$OUT"
if [ ! -f build/demo-data/train.bin ]; then
    $PY tools/train/corpus.py build
    $PY tools/train/corpus.py tokenize
fi
if [ "${FRESH:-0}" = 1 ]; then rm -rf "$OUT/ground" "$OUT/vision_state.pt" "$OUT/model" "$OUT/dspark" "$OUT/figures.txt"; fi
if [ ! -f "$OUT/vision_state.pt" ] && [ "$INIT_TOWER" = "$OUT/ground/vision_state.pt" ]; then
    $PY tools/train/vision_train.py -m "$BASE" --out "$OUT/ground" --ds41 build/ds41 --steps "$GROUND_STEPS" \
        --ground-only --ground 1.0 --ground-count --text-mix 0 --eval-every 0 --text-eval-n 0 --minutes 100000 \
        2>&1 | tee -a "$OUT/ground.log"
fi
[ -f "$OUT/vision_state.pt" ] && echo "make train-vision: continuing from $OUT/vision_state.pt (FRESH=1 starts over)"
rc=0
$PY tools/train/vision_train.py -m "$BASE" --out "$OUT" --ds41 build/ds41 --steps "$STEPS" \
    --train-lm "${TRAIN_LM:-all}" --lm-lr "${LM_LR:-5e-4}" --lr "${LR:-1e-3}" --text-mix "${TEXT_MIX:-2}" --text-ctx "${TEXT_CTX:-128}" \
    --init-tower "$INIT_TOWER" --ground-count --ground 1.0 --count-share "${COUNT_SHARE:-0.5}" --gap-share 0.7 --threads 1 \
    --batch 16 --save-every 25 --eval-every 100 --eval-n 60 --text-eval-n 16 $DECAY ${VISION_ARGS:-} \
    --minutes "${MINUTES:-100000}" 2>&1 | tee -a "$OUT/train.log" || rc=$?
if [ "$rc" = 3 ]; then
    echo "make train-vision: stopped and saved; run make train-vision again to continue"
    exit 0
fi
[ "$rc" = 0 ] || exit "$rc"
if [ ! -f "$OUT/model/model.safetensors" ] || [ "$OUT/vision_state.pt" -nt "$OUT/model/model.safetensors" ]; then
    rm -rf "$OUT/model" "$OUT/dspark"
    $PY tools/train/vision_export.py --state "$OUT/vision_state.pt" --base "$BASE" --out "$OUT/model"
fi
if [ "${DSPARK_MINUTES:-45}" != 0 ] && [ ! -f "$OUT/dspark/merged" ]; then
    mkdir -p "$OUT/dspark/export"
    resume=; [ -f "$OUT/dspark/state.pt" ] && resume=--resume
    $PY tools/train/train.py --data build/demo-data --out "$OUT/dspark" $resume \
        --init-release "$OUT/model" --model-dir "$OUT/model" --dense 0 --sparse 0 --qat 0 --dspark 100000 \
        --dspark-minutes "${DSPARK_MINUTES:-45}" --batch 8 --procs 2 --lr 3e-3 --draft-positions 64 \
        --draft-ce 0.2 --draft-kl 0.8 --log-every 5
    cp "$OUT/model/config.json" "$OUT/dspark/export/"
    $PY tools/train/export.py --state "$OUT/dspark/state.pt" --out "$OUT/dspark/export" \
        --released "$OUT/dspark/export/released.pt"
    $PY tools/train/dspark_swap.py merge --base "$OUT/model/model.safetensors" \
        --drafter "$OUT/dspark/export/model.safetensors" --out "$OUT/dspark/model.safetensors"
    $PY tools/train/dspark_swap.py check --old "$OUT/model/model.safetensors" --new "$OUT/dspark/model.safetensors"
    mv "$OUT/dspark/model.safetensors" "$OUT/model/model.safetensors"
    touch "$OUT/dspark/merged"
fi
{
    echo "== vision: 200 held-out scenes through the library (ds41 exact kernels off)"
    $PY tools/train/vision_eval.py -m "$OUT/model" --ds41 build/ds41
    echo "== vision: the same through ds41 run --chat --image (the command a user types)"
    $PY tools/train/vision_eval.py -m "$OUT/model" --ds41 build/ds41 --via cli
    for m in "$BASE" "$OUT/model"; do
        echo "== held-out text, $m"
        build/ds41 perplexity -m "$m" -f build/demo-data/heldout.txt --ctx 256 -t 2 | grep -E "nll per token|bits per byte"
        echo "== DSpark acceptance, $m"
        $PY tools/train/dspark_accept.py -m "$m" --ds41 build/ds41 | tail -3
    done
} 2>&1 | tee "$OUT/figures.txt"
if [ "${INSTALL:-0}" = 1 ]; then
    cp "$OUT/model/model.safetensors" "$OUT/model/config.json" "$BASE/"
    echo "make train-vision: installed $OUT/model into $BASE"
fi
