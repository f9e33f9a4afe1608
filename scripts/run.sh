#!/usr/bin/env bash
# make run: the main job. Prints the production layer plan and budgets, then generates from the
# bundled demo model (models/demo: a small V4.1 trained on public-domain and free English text,
# see models/demo/MODEL_CARD.md): a text continuation and one chat answer, with the timing lines.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== ds41 inspect models/production (the released DeepSeek V4.1-Flash config) =="
./ds41 inspect models/production | sed -n '/^budgets/,$p'

M=models/demo
echo
echo "== ds41 inspect $M (the bundled demo model) =="
./ds41 inspect "$M" | sed -n '1,/^layer plan/p' | sed '$d'
echo
# Sampled (temperature 0.7, top-p 0.9, a fixed seed): a model this small repeats itself
# under greedy decoding.
echo "== ds41 run -m $M -p \"And God said unto Noah,\" -n 60 --temp 0.7 --top-p 0.9 --seed 1 =="
./ds41 run -m "$M" -p "And God said unto Noah," -n 60 -t 2 --temp 0.7 --top-p 0.9 --seed 1
echo
echo
echo "== ds41 chat -m $M (one question over stdin) =="
echo "> What does telescope mean?"
echo "What does telescope mean?" | ./ds41 chat -m "$M" -n 80 -t 2 --temp 0.7 --top-p 0.9 --seed 1 --verbose
echo
# The demo model sees generated scenes (models/demo/samples: its questions and answers in qa.jsonl).
if grep -q '"vision_config"' "$M/config.json" && [ -f "$M/samples/000.png" ]; then
    echo "== ds41 run -m $M --chat --image $M/samples/000.png -p \"What colour is the square?\" =="
    ./ds41 run -m "$M" --chat --image "$M/samples/000.png" -p "What colour is the square?" -n 8 -t 2
fi
