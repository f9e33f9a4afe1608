#!/usr/bin/env bash
# ds41 chat scripted over stdin (README): on the tiny random checkpoint with the small test
# tokenizer (tests/tiny_tokenizer.py), and on each directory in DS41_TEXT_MODELS (e.g.
# DS41_TEXT_MODELS=models/demo).
#   - one answer line per user message and nothing else on stdout; greedy output is
#     deterministic, /reset starts over (the same message gives the same answer), /exit stops;
#   - the first answer is what `ds41 run` generates from the `ds41 chat-template` rendering;
#   - history: the second turn feeds only the suffix of the new rendering (--verbose counts:
#     reused = the first turn's tokens, rendered = chat-template's count); in thinking mode the
#     reasoning goes to stderr and, dropped from the history, forces a re-prefill;
#   - --spec (the tiny model has a 2-token DSpark block): with --exact, auto, fixed:1 and fixed:2
#     give the answers of --spec off byte for byte and the same per-turn counts (the session
#     holds the same tokens), and drafts are verified; a sampled conversation is reproducible;
#   - sampling flags as ds41 run (reproducible for a seed), context overflow, errors.
# About 10 s.
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./ds41}
PY=${PYTHON:-/usr/bin/python3}
CK=build/test-ck
TMP=$(mktemp -d /tmp/ds41-chat.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$CK"
export XDG_CACHE_HOME="$TMP/cache"   # the verify-width curve cache of --spec auto
# --spec auto decides from a timing curve; a measured one depends on the machine (on some,
# drafting never pays and auto never drafts, so the auto-vs-off check below would test
# nothing). This one makes a draft pay while the session's acceptance is unknown or good.
export DS41_SPEC_CURVE="$TMP/spec-curve.txt"
printf '1 100\n2 90\n3 80\npropose_s 0.001\ndraft_s 0.0002\n' >"$DS41_SPEC_CURVE"

. tests/lib.sh
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

expect_status() {
    local name=$1 want=$2 pat=$3; shift 3
    printf 'hello\n' | "$DS41" chat "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -ne "$want" ]; then fail "$name" "exit status $rc, expected $want ($(head -c 200 "$TMP/err"))"; return; fi
    if ! grep -qi -- "$pat" "$TMP/err"; then fail "$name" "message '$(head -c 200 "$TMP/err")' lacks '$pat'"; return; fi
    pass "$name"
}

tiny=$(text_checkpoint tiny) || exit 1
U1="Hello there"
U2="What does window mean?"

# chat NAME DIR ARGS... < input: stdout in $TMP/NAME.out, stderr in $TMP/NAME.err
chat() {
    local name=$1; shift
    "$DS41" chat "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
    echo $? >"$TMP/$name.rc"
}

# check_scripted NAME DIR N [reuse]: two turns, /reset, the first message again; twice. With
# "reuse" turn 2 must reuse turn 1's tokens (a trained model's answers re-tokenize to the
# tokens it generated; the random model's often do not: invalid UTF-8, non-canonical merges)
check_scripted() {
    local name=$1 dir=$2 n=$3 reuse=${4:-}
    printf '%s\n%s\n/reset\n%s\n' "$U1" "$U2" "$U1" >"$TMP/in1"
    chat "$name.a" -m "$dir" -n "$n" --exact --verbose <"$TMP/in1"
    chat "$name.b" -m "$dir" -n "$n" --exact --verbose <"$TMP/in1"
    printf '[{"role":"user","content":"%s"}]' "$U1" >"$TMP/$name.c1.json"
    "$DS41" chat-template -m "$dir" --json "$TMP/$name.c1.json" >"$TMP/$name.c1.out" 2>&1
    local ids
    ids=$("$PY" -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['ids'])))" "$TMP/$name.c1.out")
    "$DS41" run -m "$dir" --exact --prompt-ids "$ids" -n "$n" --ignore-eos --json >"$TMP/$name.run" 2>&1
    "$DS41" run -m "$dir" --exact --chat -p "$U1" -n "$n" --ignore-eos --json >"$TMP/$name.runchat" 2>&1
    "$PY" - "$TMP" "$name" "$DS41" "$dir" "$U1" "$U2" "$reuse" <<'EOF'
import json, re, subprocess, sys
tmp, name, ds41, d, u1, u2, reuse = sys.argv[1:8]
def check(case, cond, why):
    print(("PASS chat_%s_%s" % (name, case)) if cond else ("FAIL chat_%s_%s: %s" % (name, case, why)))
rc = open("%s/%s.a.rc" % (tmp, name)).read().strip()
out = open("%s/%s.a.out" % (tmp, name), "rb").read()
err = open("%s/%s.a.err" % (tmp, name)).read()
lines = out.split(b"\n")
check("exit_status", rc == "0", "exit %s: %s" % (rc, err[-300:]))
# answers may hold newlines of their own: count turns by the --verbose lines and compare the
# stdout bytes as a whole
st = [re.search(r"rendered (\d+) tokens, reused (\d+), prefilled (\d+).*generated (\d+).*stop (\S+);", l)
      for l in err.splitlines() if l.startswith("chat: turn")]
st = [tuple(int(g) if g.isdigit() else g for g in m.groups()) for m in st if m]
check("three_turns", len(st) == 3, "verbose lines: %s" % err[-400:])
if len(st) != 3:
    sys.exit(0)
same = out == open("%s/%s.b.out" % (tmp, name), "rb").read()
check("deterministic", same, "two runs differ")
# first answer == ds41 run on the chat-template rendering, cut at the first stop token,
# special tokens skipped (what chat prints)
run = [json.loads(l) for l in open("%s/%s.run" % (tmp, name)) if l.startswith("{")]
gen = [o["id"] for o in run if "id" in o]
tok = json.load(open("%s/tokenizer.json" % d))
sid = {t["content"]: t["id"] for t in tok["added_tokens"]}
stops = {sid.get(s) for s in ("<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")} - {None}
cut = []
for t in gen:
    if t in stops: break
    cut.append(t)
want = subprocess.run([ds41, "tokenize", "-m", d, "--decode", ",".join(map(str, cut)) or "", "--skip-special"],
                      capture_output=True).stdout if cut else b""
check("first_answer_equals_run", out.startswith(want + b"\n"), "chat %r, run %r" % (out[:80], want[:80]))
# ds41 run --chat -p U1 renders the same prompt as chat-template: the same tokens generated
rc_ = [json.loads(l) for l in open("%s/%s.runchat" % (tmp, name)) if l.startswith("{")]
gc = [o["id"] for o in rc_ if "id" in o]
check("run_chat_equals_template", gc == gen and len(gen) > 0, "run --chat %s, run --prompt-ids %s" % (gc[:8], gen[:8]))
r1, r2, r3 = st
check("reset_same_answer", r3[0] == r1[0] and r3[1] == 0 and out.endswith(out[:len(want) + 1]),
      "turn 3 %s vs turn 1 %s" % (r3, r1))
# turn 2: the session holds turn 1's rendering + its fed answer tokens; reused is either all of
# it (the new rendering starts with it) or 0 (re-prefill); rendered + prefilled add up
check("turn2_counts", r2[1] + r2[2] == r2[0] and r2[1] in (0, r1[0] + r1[3] - (r1[4] in ("eos", "end-of-turn"))),
      "turn 1 %s, turn 2 %s" % (r1, r2))
if reuse:
    check("turn2_reuses_history", r2[1] > 0 and r2[2] < r2[0], "turn 2 re-prefilled: %s" % (r2,))
print("  %s: turn 1 rendered %d, generated %d (%s); turn 2 rendered %d, reused %d, prefilled %d" %
      (name, r1[0], r1[3], r1[4], r2[0], r2[1], r2[2]))
EOF
}

check_scripted tiny "$tiny" 6

# ---------------------------------------------------------------- speculative decoding
# exact greedy: every --spec gives --spec off's answers and turn counts (-n 5 cuts blocks at
# the limit, -n 24 runs into stop tokens)
printf '%s\n%s\n%s\n/reset\n%s\n' "$U1" "$U2" "$U1" "$U2" >"$TMP/insp"
for n in 5 24; do
    "$DS41" chat -m "$tiny" -n $n --exact --verbose --spec off <"$TMP/insp" >"$TMP/sp_off.out" 2>"$TMP/sp_off.err"
    for sp in auto fixed:1 fixed:2; do
        name=chat_spec_${sp/:/}_n${n}_equals_off
        "$DS41" chat -m "$tiny" -n $n --exact --verbose --spec $sp <"$TMP/insp" >"$TMP/sp.out" 2>"$TMP/sp.err"
        "$PY" - "$TMP/sp_off.out" "$TMP/sp_off.err" "$TMP/sp.out" "$TMP/sp.err" "$name" <<'EOF'
import re, sys
o0, e0, o1, e1, name = open(sys.argv[1], "rb").read(), open(sys.argv[2]).read(), open(sys.argv[3], "rb").read(), open(sys.argv[4]).read(), sys.argv[5]
cnt = lambda e: [re.search(r"rendered (\d+) tokens, reused (\d+), prefilled (\d+).*generated (\d+).*stop (\S+); context (\d+)", l).groups()
                 for l in e.splitlines() if l.startswith("chat: turn")]
dr = [int(x) for x in re.findall(r"spec \S+: drafted (\d+), accepted \d+", e1)]
c0, c1 = cnt(e0), cnt(e1)
ok = o0 == o1 and c0 == c1 and len(c0) == 4 and len(dr) == 4 and sum(dr) > 0 and "spec" not in e0
print(("PASS %s" % name) if ok else "FAIL %s: answers %s, counts %s vs %s, drafted %s" % (name, "equal" if o0 == o1 else "differ", c0, c1, dr))
EOF
    done
done
for k in a b; do "$DS41" chat -m "$tiny" -n 12 --temp 0.9 --seed 3 --spec fixed:2 <"$TMP/insp" >"$TMP/ss$k.out" 2>&1; done
cmp -s "$TMP/ssa.out" "$TMP/ssb.out" && [ -s "$TMP/ssa.out" ] && pass chat_spec_sampling_reproducible || fail chat_spec_sampling_reproducible "two runs with --seed 3 differ"
expect_status err_chat_bad_spec 2 "--spec must be" -m "$tiny" --spec sometimes

# ---------------------------------------------------------------- history reuse, counted
# With -n 0 (and -n 1, whose single greedy token re-tokenizes to itself on this checkpoint)
# the new rendering starts with the session's tokens: only the suffix is prefilled, and the
# rendered count is chat-template's for the whole conversation.
for n in 0 1; do
    printf '%s\n%s\n' "$U1" "$U2" | "$DS41" chat -m "$tiny" -n $n --exact --verbose >"$TMP/r$n.out" 2>"$TMP/r$n.err"
    ans=$(head -n 1 "$TMP/r$n.out")
    "$PY" - "$TMP/r$n.c.json" "$U1" "$ans" "$U2" <<'EOF'
import json, sys
json.dump([{"role": "user", "content": sys.argv[2]}, {"role": "assistant", "content": sys.argv[3]},
           {"role": "user", "content": sys.argv[4]}], open(sys.argv[1], "w"))
EOF
    "$DS41" chat-template -m "$tiny" --json "$TMP/r$n.c.json" >"$TMP/r$n.ct" 2>&1
    "$PY" - "$TMP/r$n.err" "$TMP/r$n.ct" "$n" <<'EOF'
import json, re, sys
st = [tuple(int(x) for x in re.search(r"rendered (\d+) tokens, reused (\d+), prefilled (\d+).*generated (\d+)", l).groups())
      for l in open(sys.argv[1]) if l.startswith("chat: turn")]
n = int(sys.argv[3])
ct = len(json.load(open(sys.argv[2]))["ids"])
ok = len(st) == 2 and st[1][1] == st[0][0] + st[0][3] and st[1][2] < st[1][0] and st[1][0] == ct
print(("PASS chat_history_reused_n%d" % n) if ok else
      ("FAIL chat_history_reused_n%d: turns %s, chat-template %d tokens" % (n, st, ct)))
if ok:
    print("  -n %d: turn 2 rendered %d tokens (= chat-template), reused %d, prefilled %d" % (n, st[1][0], st[1][1], st[1][2]))
EOF
done

# ---------------------------------------------------------------- thinking mode
printf '%s\n%s\n' "$U1" "$U2" | "$DS41" chat -m "$tiny" -n 4 --exact --thinking --verbose >"$TMP/th.out" 2>"$TMP/th.err"
"$PY" - "$TMP/th.out" "$TMP/th.err" <<'EOF'
import re, sys
out, err = open(sys.argv[1], "rb").read(), open(sys.argv[2]).read()
st = [tuple(int(x) for x in re.search(r"rendered (\d+) tokens, reused (\d+), prefilled (\d+)", l).groups())
      for l in err.splitlines() if l.startswith("chat: turn")]
# the random model never closes its think block in 4 tokens: all reasoning (stderr), empty
# answers (stdout), and turn 2 re-prefills because the template drops turn 1's reasoning
ok = out.count(b"\n") == 2 and err.count("thinking: ") == 2 and len(st) == 2 and st[1][1] == 0 and st[1][2] == st[1][0]
print("PASS chat_thinking_reasoning_on_stderr_dropped" if ok else
      "FAIL chat_thinking_reasoning_on_stderr_dropped: stdout %r, turns %s, stderr %r" % (out[:80], st, err[-300:]))
EOF

# ---------------------------------------------------------------- sampling, /exit, EOF, --system
printf '%s\n' "$U1" >"$TMP/in2"
for k in a b; do "$DS41" chat -m "$tiny" -n 8 --temp 0.8 --top-k 50 --top-p 0.95 --min-p 0.01 --seed 7 -t 2 <"$TMP/in2" >"$TMP/s$k.out" 2>&1; done
cmp -s "$TMP/sa.out" "$TMP/sb.out" && [ -s "$TMP/sa.out" ] && pass chat_sampling_reproducible || fail chat_sampling_reproducible "two runs with --seed 7 differ"
printf '%s\n/exit\n%s\n' "$U1" "$U2" | "$DS41" chat -m "$tiny" -n 2 >"$TMP/x.out" 2>"$TMP/x.err"
rc=$?
[ $rc -eq 0 ] && [ "$(grep -c '' "$TMP/x.out")" -eq 1 ] && pass chat_exit_command || fail chat_exit_command "exit $rc, $(grep -c '' "$TMP/x.out") lines"
printf '' | "$DS41" chat -m "$tiny" >"$TMP/e.out" 2>"$TMP/e.err"
rc=$?
[ $rc -eq 0 ] && [ ! -s "$TMP/e.out" ] && pass chat_empty_input || fail chat_empty_input "exit $rc, stdout '$(head -c 80 "$TMP/e.out")'"
printf '%s\n' "$U1" | "$DS41" chat -m "$tiny" -n 0 --system "You are terse." --verbose >/dev/null 2>"$TMP/sys.err"
printf '[{"role":"system","content":"You are terse."},{"role":"user","content":"%s"}]' "$U1" >"$TMP/sys.json"
want=$("$DS41" chat-template -m "$tiny" --json "$TMP/sys.json" | "$PY" -c "import json,sys; print(len(json.load(sys.stdin)['ids']))")
grep -q "rendered $want tokens" "$TMP/sys.err" && pass chat_system_message || fail chat_system_message "$(grep turn "$TMP/sys.err") vs chat-template $want"

# ---------------------------------------------------------------- context, errors
long=$("$PY" -c "print(' '.join(['window light'] * 40))")
printf '%s\n%s\n' "$long" "$U1" | "$DS41" chat -m "$tiny" -c 32 -n 2 >"$TMP/o.out" 2>"$TMP/o.err"
rc=$?
[ $rc -eq 1 ] && grep -q "the context holds 32" "$TMP/o.err" && [ "$(grep -c '' "$TMP/o.out")" -eq 2 ] &&
    pass chat_context_overflow || fail chat_context_overflow "exit $rc, $(tail -n 1 "$TMP/o.err"), $(grep -c '' "$TMP/o.out") lines"
"$DS41" chat --help >"$TMP/h" 2>&1 && grep -q -- "--thinking" "$TMP/h" && pass chat_help || fail chat_help "$(head -n 2 "$TMP/h")"
expect_status err_chat_no_model 2 "-m DIR is required"
expect_status err_chat_unknown_option 2 "unknown option" -m "$tiny" --bogus
expect_status err_chat_bad_temp 2 "expected a number" -m "$tiny" --temp x
expect_status err_chat_bad_top_p 2 "top-p must be in" -m "$tiny" --top-p 0
expect_status err_chat_bad_prefill 2 "ced, full or ced-replay" -m "$tiny" --prefill fast
expect_status err_chat_no_dir 1 "cannot open" -m "$TMP/nodir"
notok=$TMP/notok
mkdir -p "$notok"
for f in config.json model.safetensors engram_token_map.i32; do ln -s "$(readlink -f "$tiny/$f")" "$notok/$f"; done
expect_status err_chat_no_tokenizer 1 "no tokenizer.json" -m "$notok"
"$DS41" run -m "$tiny" --chat --prompt-ids 1,2 >"$TMP/out" 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && grep -q -- "--chat renders -p TEXT" "$TMP/err"; then pass err_run_chat_ids; else fail err_run_chat_ids "status $rc: $(head -c 200 "$TMP/err")"; fi

# ---------------------------------------------------------------- further checkpoints
for m in ${DS41_TEXT_MODELS:-}; do
    check_scripted "$(basename "$m")" "$m" 32 reuse
done
