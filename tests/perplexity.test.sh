#!/usr/bin/env bash
# ds41 perplexity (README): on the tiny random checkpoint with the small test tokenizer
# (tests/tiny_tokenizer.py), and on each checkpoint directory listed in DS41_TEXT_MODELS
# (space-separated, e.g. DS41_TEXT_MODELS=models/demo; DS41_TEXT_FILE picks its text, default
# a generated one).
#   - the JSON report is consistent: windows and scored tokens follow from the token count,
#     ctx and stride; perplexity = exp(nll per token); bits per byte = nll / ln 2 / bytes;
#   - the NLL equals an independent recomputation: each window fed through `ds41 run --exact`
#     (its first half as the prompt, the rest teacher-forced, --dump-logits), log-softmax in
#     NumPy, and the scored bytes from `ds41 tokenize --decode`. Bit-identical logits on the tiny
#     checkpoint (tests/test_feed_logits.c), so the totals agree to 1e-9; 1e-3 elsewhere;
#   - --chunk >= window gives the same total bit for bit, fast mode is near exact;
#   - stdin input, the text report, and the errors (exit 1 bad input, 2 bad usage).
# About 15 s (40 s under ASan).
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./ds41}
PY=${PYTHON:-/usr/bin/python3}
CK=build/test-ck
TMP=$(mktemp -d /tmp/ds41-ppl.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$CK"

. tests/lib.sh
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

# expect_status NAME STATUS PATTERN ARGS...: exit status STATUS and a message matching PATTERN
expect_status() {
    local name=$1 want=$2 pat=$3; shift 3
    "$DS41" perplexity "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
    local rc=$?
    if [ $rc -ne "$want" ]; then fail "$name" "exit status $rc, expected $want ($(head -c 200 "$TMP/err"))"; return; fi
    if ! grep -qi -- "$pat" "$TMP/err"; then fail "$name" "message '$(head -c 200 "$TMP/err")' lacks '$pat'"; return; fi
    pass "$name"
}

tiny=$(text_checkpoint tiny) || exit 1
TEXT=$TMP/text.txt
# under ASan (make check-asan) a third of the text: exact kernels are slow there
"$PY" - "$TEXT" "${DS41_ASAN:+8}" <<'EOF'
import random, sys
r = random.Random(7)
lines = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else 24
words = ("the quick brown fox jumps over lazy dog a small model reads text one token at time and "
         "guesses next window light air sun moon east west").split()
with open(sys.argv[1], "w") as f:
    for i in range(lines):
        f.write(" ".join(r.choice(words) for _ in range(10)) + ".\n")
EOF

# check_model NAME DIR TEXT CTX STRIDE TOL: JSON consistency and the decode recomputation
check_model() {
    local name=$1 dir=$2 text=$3 ctx=$4 stride=$5 tol=$6
    if ! "$DS41" perplexity -m "$dir" -f "$text" --ctx "$ctx" --exact --json >"$TMP/$name.json" 2>"$TMP/$name.err" ||
       ! "$DS41" perplexity -m "$dir" -f "$text" --ctx "$ctx" --stride "$stride" --exact --json >"$TMP/$name.s.json" 2>>"$TMP/$name.err" ||
       ! "$DS41" tokenize -m "$dir" --no-special - <"$text" >"$TMP/$name.ids" 2>>"$TMP/$name.err"; then
        fail "ppl_${name}_runs" "$(tail -n 1 "$TMP/$name.err")"
        return
    fi
    "$PY" - "$DS41" "$dir" "$TMP/$name.json" "$TMP/$name.s.json" "$TMP/$name.ids" "$TMP" "$name" "$tol" <<'EOF'
import json, math, subprocess, sys
import numpy as np
ds41, d, jf, sf, idf, tmp, name, tol = sys.argv[1:9]
tol = float(tol)
o, so = json.load(open(jf)), json.load(open(sf))
ids = [int(x) for x in open(idf).read().split()]
def check(case, cond, why):
    print(("PASS ppl_%s_%s" % (name, case)) if cond else ("FAIL ppl_%s_%s: %s" % (name, case, why)))
keys = {"file", "perplexity", "perplexity_stderr", "nll_per_token", "nll_total", "bits_per_byte", "tokens_scored",
        "bytes_scored", "windows", "ctx", "stride", "first_scored_row", "tokens_in_file", "bytes_in_file",
        "tokens_evaluated", "seconds", "tokens_per_s", "exact", "threads"}
check("json_keys", set(o) == keys and set(so) == keys, "keys %s" % sorted(set(o) ^ keys))
C, S, n = o["ctx"], so["stride"], len(ids)
first = C // 2
ok = (o["tokens_in_file"] == n and o["windows"] == n // C and o["tokens_scored"] == o["windows"] * (C - 1 - first)
      and o["stride"] is None and o["first_scored_row"] == first and o["tokens_evaluated"] == o["windows"] * C)
check("default_windows", ok, "n %d ctx %d: %s" % (n, C, {k: o[k] for k in ("windows", "tokens_scored", "first_scored_row")}))
ok = so["windows"] == (n - C) // S + 1 and so["tokens_scored"] == so["windows"] * S and so["first_scored_row"] == C - S - 1
check("stride_windows", ok, "n %d ctx %d stride %d: %s" % (n, C, S, {k: so[k] for k in ("windows", "tokens_scored")}))
ok = all(abs(x["perplexity"] - math.exp(x["nll_per_token"])) <= 1e-9 * x["perplexity"] and
         abs(x["nll_per_token"] * x["tokens_scored"] - x["nll_total"]) <= 1e-9 * abs(x["nll_total"]) and
         abs(x["bits_per_byte"] - x["nll_total"] / math.log(2) / x["bytes_scored"]) <= 1e-12 * x["bits_per_byte"]
         for x in (o, so))
check("json_consistent", ok, "ppl/nll/bpb relations")

def recompute(starts, first):
    """NLL and bytes of windows at `starts` (scoring rows first..C-2) through ds41 run --exact."""
    bos = ids[0]
    nll, nbytes = 0.0, 0
    for w, st in enumerate(starts):
        win = [bos] + ids[st + 1:st + C]
        k = C - 1 - first
        p = subprocess.run([ds41, "run", "-m", d, "--exact", "--ignore-eos", "-n", str(k),
                            "--prompt-ids", ",".join(map(str, win[:first + 1])),
                            "--force-ids", ",".join(map(str, win[first + 1:])),
                            "--dump-logits", "%s/%s.w%d.f32" % (tmp, name, w)], capture_output=True, text=True)
        if p.returncode:
            raise SystemExit("FAIL ppl_%s_recompute: ds41 run: %s" % (name, p.stderr.strip()[-200:]))
        lg = np.fromfile("%s/%s.w%d.f32" % (tmp, name, w), dtype="<f4").astype(np.float64).reshape(k, -1)
        for j in range(k):
            row = lg[j]
            m = row.max()
            nll += m + math.log(np.exp(row - m).sum()) - row[win[first + 1 + j]]
        t = subprocess.run([ds41, "tokenize", "-m", d, "--decode", ",".join(map(str, win[first + 1:]))],
                           capture_output=True)
        nbytes += len(t.stdout)
    return nll, nbytes

nll, nb = recompute([w * C for w in range(o["windows"])], first)
rel = abs(nll - o["nll_total"]) / abs(nll)
check("nll_equals_decode_recompute", abs(nll - o["nll_total"]) <= tol * abs(nll),
      "perplexity %.12g, ds41 run recomputation %.12g (rel %.2g, tol %g)" % (o["nll_total"], nll,
                                                                           abs(nll - o["nll_total"]) / abs(nll), tol))
check("bytes_equal_decode", nb == o["bytes_scored"], "perplexity %d bytes, tokenize --decode %d" % (o["bytes_scored"], nb))
nll, nb = recompute([w * S for w in range(so["windows"])], C - S - 1)
check("stride_nll_equals_decode_recompute", abs(nll - so["nll_total"]) <= tol * abs(nll),
      "perplexity %.12g, recomputation %.12g" % (so["nll_total"], nll))
check("stride_bytes_equal_decode", nb == so["bytes_scored"], "%d vs %d" % (so["bytes_scored"], nb))
print("  %s: ctx %d: perplexity %.4f, %.4f bits/byte, %d tokens scored (decode recomputation: rel. diff %.2g);"
      " stride %d: perplexity %.4f, %d scored" % (name, C, o["perplexity"], o["bits_per_byte"], o["tokens_scored"], rel, S,
                                                 so["perplexity"], so["tokens_scored"]))
EOF
}

check_model tiny "$tiny" "$TEXT" 32 12 1e-9
for m in ${DS41_TEXT_MODELS:-}; do
    check_model "$(basename "$m")" "$m" "${DS41_TEXT_FILE:-$TEXT}" 64 16 1e-3
done

# ---------------------------------------------------------------- modes that must agree
jget() { "$PY" -c "import json,sys; print(repr(json.load(open(sys.argv[1]))[sys.argv[2]]))" "$1" "$2"; }
if "$DS41" perplexity -m "$tiny" -f "$TEXT" --ctx 32 --exact --json --chunk 16 >"$TMP/c16.json" 2>"$TMP/c.err" &&
   "$DS41" perplexity -m "$tiny" -f - --ctx 32 --exact --json <"$TEXT" >"$TMP/stdin.json" 2>>"$TMP/c.err" &&
   "$DS41" perplexity -m "$tiny" -f "$TEXT" --ctx 32 -t 2 --json >"$TMP/fast.json" 2>>"$TMP/c.err"; then
    a=$(jget "$TMP/tiny.json" nll_total)
    [ "$(jget "$TMP/c16.json" nll_total)" = "$a" ] && pass ppl_chunk_window_same_nll ||
        fail ppl_chunk_window_same_nll "--chunk 16: $(jget "$TMP/c16.json" nll_total) vs $a"
    [ "$(jget "$TMP/stdin.json" nll_total)" = "$a" ] && [ "$(jget "$TMP/stdin.json" file)" = "'standard input'" ] &&
        pass ppl_stdin_same_nll || fail ppl_stdin_same_nll "-f -: $(jget "$TMP/stdin.json" nll_total) vs $a"
    # fast kernels (2 threads) vs exact: measured 0.003 nats/token apart on this text
    "$PY" - "$TMP/tiny.json" "$TMP/fast.json" <<'EOF'
import json, sys
e, f = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
d = abs(e["nll_per_token"] - f["nll_per_token"])
ok = d < 0.05 and f["exact"] is False and f["threads"] == 2 and f["tokens_scored"] == e["tokens_scored"]
print("PASS ppl_fast_near_exact" if ok else "FAIL ppl_fast_near_exact: nll/token exact %.6f fast %.6f" %
      (e["nll_per_token"], f["nll_per_token"]))
print("  fast vs exact: %.2g nats/token" % d)
EOF
else
    fail ppl_modes "$(tail -n 1 "$TMP/c.err")"
fi

# ---------------------------------------------------------------- text report
if "$DS41" perplexity -m "$tiny" -f "$TEXT" --ctx 32 >"$TMP/plain.out" 2>"$TMP/plain.err"; then
    ok=1
    for k in "^perplexity " "^nll per token " "^bits per byte " "^tokens scored " "^speed .*tokens/s"; do
        grep -q "$k" "$TMP/plain.out" || ok=0
    done
    [ $ok = 1 ] && [ "$(wc -l <"$TMP/plain.out")" -eq 5 ] && pass ppl_text_report ||
        fail ppl_text_report "$(cat "$TMP/plain.out")"
else
    fail ppl_text_report "$(tail -n 1 "$TMP/plain.err")"
fi
"$DS41" perplexity --help >"$TMP/h" 2>&1 && grep -q -- "--stride" "$TMP/h" && pass ppl_help || fail ppl_help "$(head -n 2 "$TMP/h")"

# ---------------------------------------------------------------- errors
: >"$TMP/empty.txt"
printf 'the quick brown fox\n' >"$TMP/short.txt"
expect_status err_missing_file 1 "cannot open" -m "$tiny" -f "$TMP/nope.txt"
expect_status err_empty_file 1 "is empty" -m "$tiny" -f "$TMP/empty.txt"
expect_status err_too_short 1 "fewer than one window" -m "$tiny" -f "$TMP/short.txt" --ctx 32
expect_status err_stride_ge_ctx 2 "must be less than" -m "$tiny" -f "$TEXT" --ctx 32 --stride 32
expect_status err_stride_ge_default_ctx 2 "must be less than" -m "$tiny" -f "$TEXT" --stride 128
expect_status err_stride_zero 2 "expected an integer in 1" -m "$tiny" -f "$TEXT" --stride 0
expect_status err_ctx_one 2 "expected an integer in 2" -m "$tiny" -f "$TEXT" --ctx 1
expect_status err_ctx_beyond_model 1 "context size" -m "$tiny" -f "$TEXT" --ctx 100000
expect_status err_no_file_arg 2 "-f FILE is required" -m "$tiny"
expect_status err_no_model_arg 2 "-m DIR is required" -f "$TEXT"
expect_status err_unknown_option 2 "unknown option" -m "$tiny" -f "$TEXT" --bogus
expect_status err_bad_threads 2 "expected an integer" -m "$tiny" -f "$TEXT" -t x
expect_status err_no_model_dir 1 "cannot open" -m "$TMP/nodir" -f "$TEXT"
notok=$TMP/notok
mkdir -p "$notok"
for f in config.json model.safetensors engram_token_map.i32; do ln -s "$(readlink -f "$tiny/$f")" "$notok/$f"; done
expect_status err_no_tokenizer 1 "no tokenizer.json" -m "$notok" -f "$TEXT"
