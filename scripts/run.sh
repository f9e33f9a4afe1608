#!/usr/bin/env bash
# make run: the main job. Prints the production layer plan and budgets, then (when the
# forward pass is built) writes the bundled tiny random checkpoint and generates from it.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== ds41 inspect models/production (the released DeepSeek V4.1-Flash config) =="
./ds41 inspect models/production
