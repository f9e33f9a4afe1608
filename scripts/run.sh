#!/usr/bin/env bash
# make run: the main job. Prints the production layer plan and budgets, then (when the
# forward pass is built) writes the bundled tiny random checkpoint and generates from it.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== ds41 inspect models/production (the released DeepSeek V4.1-Flash config) =="
./ds41 inspect models/production

# The bundled tiny checkpoint: tests/configs/tiny (the 6-layer + 1 DSpark stage oracle config
# of spec 9) with seeded random weights, written once into build/run/tiny. Random weights, so
# the ids are noise; there is no tokenizer for this vocabulary, so ds41 prints ids.
ck=build/run/tiny
if [ ! -f "$ck/model.safetensors" ] && [ ! -f "$ck/model.safetensors.index.json" ]; then
    echo
    echo "== writing the tiny random checkpoint to $ck =="
    /usr/bin/python3 tools/make_checkpoint.py tests/configs/tiny "$ck" --seed 1 --token-map stub -q
fi
echo
echo "== ds41 run -m $ck --prompt-ids 1,2,3,...,40 -n 32 (greedy, CED prefill) =="
./ds41 run -m "$ck" --prompt-ids "$(seq -s, 1 40)" -n 32 --ignore-eos
echo
echo "== the same with --json --draft-trace -n 3: per-token top logprobs and the DSpark proposals =="
./ds41 run -m "$ck" --prompt-ids "$(seq -s, 1 40)" -n 3 --ignore-eos --json --top-logprobs 2 --draft-trace
