#!/usr/bin/env bash
# The bundled demo model (models/demo, trained by tools/train/): ds41 against the two other
# implementations that read the same released files.
#  * exact mode vs the Python reference (tools/reference/ref.py, NumPy): trace directories
#    byte-identical (tokens, logits of every step, top-k, experts, KV / index-K / SWA records,
#    compressor state, DSpark proposals) for a short chat prompt, a KJV verse and a 330-token
#    held-out passage (five windows of 64, 165 ratio-2 entries against index_topk 32, so the
#    indexer and the candidate pool decide), CED and full prefill, both index-K readings;
#  * perplexity: `ds41 perplexity` (fast kernels, release formats) within 1 % of the torch twin
#    (tools/train/v41.py in `sim` mode: the release numerics simulated) run on the weights
#    decoded from the same model.safetensors, on the same windows of held-out text; the
#    remaining difference is the fast kernels' and torch's summation orders and the twin's
#    float32 softmax normalisation before the BF16 rounding of the probabilities;
#  * greedy text of `ds41 run` in exact mode equal to --spec off / fixed:4 (speculation on a
#    trained drafter), and chat scripted over stdin answering in format.
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./ds41}
PY=${PYTHON:-/usr/bin/python3}
M=${DS41_DEMO_MODEL:-models/demo}
T=$(mktemp -d /tmp/ds41_demo_model.XXXXXX)
trap 'rm -rf "$T"' EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

if [ ! -f "$M/model.safetensors" ]; then
    fail demo_model_present "$M/model.safetensors is missing"
    exit 0
fi
pass demo_model_present

ids_of() { "$DS41" tokenize -m "$M" "$1" | tr ' ' ','; }

# compare NAME IDS N WHAT "C ARGS" "PY ARGS"; WHAT = all | state (CED: decoder top-k / expert rows skipped)
compare() {
    local name=$1 prompt=$2 n=$3 what=$4 cargs=$5 pargs=$6
    local a=$T/$name.py b=$T/$name.c
    if ! "$PY" tools/reference/ref.py -m "$M" --prompt-ids "$prompt" -n "$n" --trace "$a" $pargs >"$T/py.log" 2>&1; then
        fail "$name" "ref.py failed: $(tail -n 3 "$T/py.log" | tr '\n' ' ')"; return
    fi
    if ! "$DS41" run -m "$M" --prompt-ids "$prompt" -n "$n" --exact --ignore-eos --spec off --trace "$b" $cargs >"$T/c.log" 2>&1; then
        fail "$name" "ds41 run failed: $(tail -n 3 "$T/c.log" | tr '\n' ' ')"; return
    fi
    local bad="" nf=0
    for f in $(cd "$a" && ls); do
        if [ "$what" = state ]; then case $f in topk_*|experts_*) continue ;; esac; fi
        nf=$((nf + 1))
        [ -f "$b/$f" ] || { bad="$bad $f(missing)"; continue; }
        cmp -s "$a/$f" "$b/$f" || bad="$bad $f"
    done
    if [ "$nf" -lt 10 ]; then fail "$name" "reference wrote only $nf trace files"
    elif [ -n "$bad" ]; then fail "$name" "differs in$bad"
    else pass "$name ($nf files identical, $(echo "$prompt" | tr ',' '\n' | wc -l) prompt tokens)"; fi
}

CHAT=$(echo '[{"role":"user","content":"What does apple mean?"}]' | "$DS41" chat-template -m "$M" --json - 2>/dev/null |
       "$PY" -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))' 2>/dev/null)
[ -n "$CHAT" ] || CHAT=$(ids_of "What does apple mean?")
VERSE=$(ids_of "In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep.")
LONG=$("$PY" - "$M/heldout/heldout_pd.jsonl" <<'EOF' | "$DS41" tokenize -m "$M" - | tr ' ' ',' | cut -d, -f1-330
import json, sys
docs = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8")]
print("\n\n".join(docs[:3]))
EOF
)
compare demo_exact_chat_ced "$CHAT" 12 state "" ""
if [ -n "${DS41_ASAN:-}" ]; then
    # under the sanitizers: the short comparison above and the scripted chat below
    out=$(printf 'What does apple mean?\n' | "$DS41" chat -m "$M" -n 16 2>/dev/null)
    [ -n "$out" ] && pass demo_chat_asan || fail demo_chat_asan "no answer"
    exit 0
fi
compare demo_exact_verse_full "$VERSE" 12 all "--prefill full" ""
compare demo_exact_long_full "$LONG" 8 all "--prefill full" ""
# (CED on the long passage: demo_exact_long_chunked below is CED too, its chunks planned against
# the prompt's end, and compares the same state files)
compare demo_exact_long_official "$LONG" 8 all "--prefill full --index-k official" "--index-k official"
compare demo_exact_long_chunked "$LONG" 4 state "--chunk 100" "--chunk 100"

# --- perplexity: ds41 (fast, release formats) vs the torch twin on the same decoded weights ---
HELD=build/demo-data/heldout.txt
if [ ! -f "$HELD" ]; then
    # the public-domain part of the held-out split is committed; its text is enough here
    "$PY" - "$M/heldout/heldout_pd.jsonl" >"$T/held.txt" <<'EOF'
import json, sys
print("\n\n".join(json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8")))
EOF
    HELD=$T/held.txt
fi
head -c 16000 "$HELD" >"$T/ppl.txt"
if ! "$PY" -c 'import torch' 2>/dev/null; then
    fail demo_perplexity_vs_torch "python3-torch is not installed (run: make setup)"
else
    "$DS41" perplexity -m "$M" -f "$T/ppl.txt" --ctx 256 -t 2 --json >"$T/ppl_c.json" 2>"$T/ppl_c.log"
    nwin=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["windows"])' "$T/ppl_c.json" 2>/dev/null)
    if [ -z "$nwin" ]; then
        fail demo_perplexity_vs_torch "ds41 perplexity failed: $(tail -n 2 "$T/ppl_c.log" | tr '\n' ' ')"
    elif ! "$PY" tools/train/evaluate.py -m "$M" -f "$T/ppl.txt" --ctx 256 --max-windows "$nwin" --threads 2 \
            --ds41 "$DS41" >"$T/ppl_t.json" 2>"$T/ppl_t.log"; then
        fail demo_perplexity_vs_torch "evaluate.py failed: $(tail -n 2 "$T/ppl_t.log" | tr '\n' ' ')"
    else
        r=$("$PY" - "$T/ppl_c.json" "$T/ppl_t.json" <<'EOF'
import json, sys
c, t = (json.load(open(p)) for p in sys.argv[1:3])
ok = c["tokens_scored"] == t["tokens"] and abs(c["perplexity"] / t["perplexity"] - 1) <= 0.01
print("%s ds41 %.4f torch %.4f (%+.3f %%) over %d tokens, %d windows; bits/byte %.4f"
      % ("ok" if ok else "bad", c["perplexity"], t["perplexity"], 100 * (c["perplexity"] / t["perplexity"] - 1),
         c["tokens_scored"], c["windows"], c["bits_per_byte"]))
EOF
)
        case $r in ok*) pass "demo_perplexity_vs_torch (${r#ok })" ;; *) fail demo_perplexity_vs_torch "${r#bad }" ;; esac
    fi
fi

# --- speculative decoding on the trained drafter: greedy output unchanged ---------------------
P="And God said, Let there be"
"$DS41" run -m "$M" -p "$P" -n 40 --exact --spec off --dump-logits "$T/a.f32" >"$T/a.txt" 2>/dev/null
for s in fixed:4 auto; do
    if "$DS41" run -m "$M" -p "$P" -n 40 --exact --spec $s --dump-logits "$T/b.f32" >"$T/b.txt" 2>"$T/b.log" &&
       cmp -s "$T/a.txt" "$T/b.txt" && cmp -s "$T/a.f32" "$T/b.f32"; then
        pass "demo_spec_${s%%:*}_greedy_identical ($(grep -o 'accept[^,]*' "$T/b.log" | head -n 1))"
    else
        fail "demo_spec_${s%%:*}_greedy_identical" "text or logits differ from --spec off"
    fi
done

# --- chat over stdin: an answer in format -----------------------------------------------------
out=$(printf 'What does apple mean?\n/reset\nTell me a fortune.\n' | "$DS41" chat -m "$M" -n 48 2>"$T/chat.log")
lines=$(printf '%s\n' "$out" | grep -c .)
if [ "$lines" -ge 2 ] && printf '%s' "$out" | grep -qi '[a-z][a-z][a-z]'; then
    pass "demo_chat_scripted ($lines answer lines)"
else
    fail demo_chat_scripted "answers: $(printf '%s' "$out" | head -c 200)"
fi
