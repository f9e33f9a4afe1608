#!/usr/bin/env bash
# The API agents need (issue 25) on models/demo, on an exact --spec off server and an exact
# --spec fixed:3 one: sampling controls and validation (tests/serve/api_sampling.py); constrained
# output through the OpenAI SDK validated with ajv, batch invariance and spec = plain
# (tests/serve/api_structured.mjs); /v1/messages through the Anthropic SDK, equal to the chat route
# (tests/serve/api_messages.mjs); /v1/responses likewise through the openai SDK
# (tests/serve/api_responses.mjs); the grammar table cache (tests/serve/grammar_cache.py); connection limits per address and in total (tests/serve/conn_limits.py).
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./ds41}
PY=${PYTHON:-/usr/bin/python3}
TMP=$(mktemp -d /tmp/ds41-api.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT
export XDG_CACHE_HOME="$TMP/cache"
. tests/lib.sh
fail() { echo "FAIL $1: $2"; }
serve_start plain -m models/demo --exact -c 2048 --spec off || exit 1
PA=$PORT
serve_start spec -m models/demo --exact -c 2048 --spec fixed:3 || exit 1
PB=$PORT
timeout 300 "$PY" tests/serve/api_sampling.py "$PA" "$PB" || echo "FAIL api_sampling: exit status $?"
timeout 60 "$PY" tests/serve/grammar_cache.py "$PA" || echo "FAIL grammar_cache: exit status $?"
if [ -d tests/oracle/node_modules/openai ] && [ -d tests/oracle/node_modules/ajv ]; then
    timeout 500 node tests/serve/api_structured.mjs "$PA" "$PB" || echo "FAIL api_structured: exit status $?"
else
    echo "FAIL api_structured: tests/oracle/node_modules (openai, ajv) missing (run make setup)"
fi
# Anthropic Messages through @anthropic-ai/sdk, compared with /v1/chat/completions (tests/serve/api_messages.mjs)
if [ -d tests/oracle/node_modules/@anthropic-ai/sdk ] && [ -d tests/oracle/node_modules/openai ]; then
    timeout 300 node tests/serve/api_messages.mjs "$PA" "$PB" || echo "FAIL api_messages: exit status $?"
else
    echo "FAIL api_messages: tests/oracle/node_modules (@anthropic-ai/sdk, openai) missing (run make setup)"
fi
# OpenAI Responses through the openai SDK, compared with /v1/chat/completions (tests/serve/api_responses.mjs)
if [ -d tests/oracle/node_modules/openai ] && [ -d tests/oracle/node_modules/ajv ]; then
    timeout 300 node tests/serve/api_responses.mjs "$PA" || echo "FAIL api_responses: exit status $?"
else
    echo "FAIL api_responses: tests/oracle/node_modules (openai, ajv) missing (run make setup)"
fi
# connection limits: a server of its own
serve_start conn -m models/demo -c 256 --spec off --max-connections 8 --max-connections-per-ip 4 || exit 1
timeout 60 "$PY" tests/serve/conn_limits.py "$PORT" || echo "FAIL conn_limits: exit status $?"
