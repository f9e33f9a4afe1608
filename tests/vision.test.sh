#!/usr/bin/env bash
# The vision tower and aligner (docs/vision.md) on tests/configs/tinyvl (the tiny model with a
# 2-layer, width-64 tower written by make_checkpoint.py --vision), against the Python reference
# (tools/reference/vision.py and model.py, tests/vision_ref.py):
#   - `ds41 image --exact --dump`: the image span bit for bit, on images of 1 x 1 patches, 3 x 2
#     patches (one padded token) and 14 x 13 patches (182 patches: three 64-wide query and key
#     tiles of the attention, padding on both sides of the 3 x 3 unshuffle), with 1 and 2 threads;
#   - fast mode within a stated tolerance: the tower's matmuls and softmax sum in FP32 in another
#     order, so a BF16 rounding (2^-8 relative) flips here and there and the flips spread through
#     2 blocks and the aligner: max |diff| <= 4 % of max |ref|, RMS(diff) <= 1 % of RMS(ref)
#     (measured: 0.6 % and 0.2 % on the 14 x 13 image);
#   - the language-model side through the library (tests/tools/vision_feed.c: ds41_image_span,
#     ds41_feed_embeds): text, the image span, text, then greedy decode steps; the logits rows
#     bit for bit (image embeddings placed, bias_vl routing, Engram gate 0 and no n-gram across
#     the image), also with the prompt in chunks of 8 across the span; text-only
#     ds41_feed_embeds equals ds41_feed bit for bit;
#   - errors: pixels of the wrong size, sides not multiples of 14, a checkpoint without a tower,
#     a vision tensor misshaped or missing (each named);
#   - ds41 serve: a PNG and a JPEG data URL on /v1/chat/completions answer as ds41 run --image
#     (exact, greedy) with the span positions in usage; malformed image parts and a checkpoint
#     without a tower get 400s naming them; through the official SDKs (tests/serve/vision_sdk.mjs)
#     the same answer on /v1/chat/completions, /v1/responses (input_image) and /v1/messages
#     (image blocks, base64 and data: URL, also inside a tool result), usage and count_tokens
#     equal to the prefilled positions, 400s naming the field, and a context overflowed by the
#     image spans refused at admission; --kv-budget counts the span positions as token ids.
#   - the image-keyed prefix cache: ds41 run --image --cache-dir and the server restore a
#     repeated image prompt bit for bit (DSpark drafts too), miss on another image of the same
#     size, and treat damaged block files as misses.
# About 9 s of CPU (the SDK checks about 1.5 of it).
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./ds41}
PY=${PYTHON:-/usr/bin/python3}
BUILD=$(dirname "$DS41")
CK=build/test-ck
TMP=$(mktemp -d /tmp/ds41-vision.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
mkdir -p "$CK"
. tests/lib.sh
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

VCK=$CK/conf-tinyvl-vision
if [ ! -f "$VCK/.complete" ] || ! cmp -s "$VCK/config.json" tests/configs/tinyvl/config.json; then
    rm -rf "$VCK"
    "$PY" tools/make_checkpoint.py tests/configs/tinyvl "$VCK" --seed 1 --token-map stub --vision -q \
        || { fail checkpoint "make_checkpoint.py --vision failed"; exit 1; }
    touch "$VCK/.complete"
fi

# ---- embeddings, exact and fast ----
for img in "14 14 1" "28 42 2" "182 196 3"; do
    set -- $img
    H=$1 W=$2 name=${1}x${2}
    "$PY" tests/vision_ref.py pixels "$H" "$W" "$3" "$TMP/px.bin"
    "$PY" tests/vision_ref.py span "$VCK" "$TMP/px.bin" "$H" "$W" "$TMP/ref.f32" || { fail "span_ref_$name" "reference failed"; continue; }
    for t in 1 2; do
        r=
        if "$DS41" image -m "$VCK" --pixels "$TMP/px.bin" --width "$W" --height "$H" --exact -t $t --dump "$TMP/c.f32" \
            >"$TMP/out" 2>"$TMP/err" && r=$("$PY" tests/vision_ref.py cmp "$TMP/ref.f32" "$TMP/c.f32"); then
            pass "span_exact_${name}_t$t"
        else
            fail "span_exact_${name}_t$t" "${r:-$(head -c 300 "$TMP/err")}"
        fi
    done
    r=
    if "$DS41" image -m "$VCK" --pixels "$TMP/px.bin" --width "$W" --height "$H" -t 2 --dump "$TMP/f.f32" \
        >"$TMP/out" 2>"$TMP/err" && r=$("$PY" tests/vision_ref.py cmp "$TMP/ref.f32" "$TMP/f.f32" 0.04); then
        pass "span_fast_$name"
    else
        fail "span_fast_$name" "${r:-$(head -c 300 "$TMP/err")}"
    fi
done
# the summary line of the last image: 14 x 13 patches -> 5 x 5 tokens -> 5 * 6 + 2 positions
if grep -q "patch grid 14 x 13, token grid 5 x 5, span 32 positions" "$TMP/out"; then pass image_summary
else fail image_summary "$(cat "$TMP/out")"; fi
# --tokens-only: the span without the delimiters (rows 1..5 of every 6 after the start)
if "$DS41" image -m "$VCK" --pixels "$TMP/px.bin" --width 196 --height 182 --exact --tokens-only --dump "$TMP/tok.f32" >/dev/null 2>&1 &&
    "$PY" -c "
import numpy as np, sys
s = np.fromfile('$TMP/ref.f32', dtype='<f4').reshape(32, -1)
t = np.fromfile('$TMP/tok.f32', dtype='<f4').reshape(25, -1)
sys.exit(0 if np.array_equal(s[1:31].reshape(5, 6, -1)[:, :5].reshape(25, -1).view(np.uint32), t.view(np.uint32)) else 1)"; then
    pass tokens_only
else
    fail tokens_only "the aligned tokens differ from the span's"
fi

# ---- the language model: logits after an image, bit for bit ----
"$PY" tests/vision_ref.py pixels 126 140 4 "$TMP/px.bin"
if "$BUILD/tests/tools/vision_feed" "$VCK" "$TMP/px.bin" 126 140 5 4 3 "$TMP/c_lg.f32" >"$TMP/feed.out" 2>"$TMP/err"; then
    cat "$TMP/feed.out"
    if "$PY" tests/vision_ref.py logits "$VCK" "$TMP/px.bin" 126 140 5 4 3 "$TMP/r_lg.f32" &&
        r=$("$PY" tests/vision_ref.py cmp "$TMP/r_lg.f32" "$TMP/c_lg.f32"); then
        pass logits_after_image_exact
    else
        fail logits_after_image_exact "${r:-reference failed}"
    fi
else
    fail vision_feed "$(cat "$TMP/feed.out") $(head -c 300 "$TMP/err")"
fi
# chunks of 8: the span (17 positions from 5) straddles three chunk bounds; the Engram history
# carries its dead positions from one forward to the next
if "$BUILD/tests/tools/vision_feed" "$VCK" "$TMP/px.bin" 126 140 5 4 3 "$TMP/c_ch.f32" 8 >/dev/null 2>"$TMP/err" &&
    "$PY" tests/vision_ref.py logits "$VCK" "$TMP/px.bin" 126 140 5 4 3 "$TMP/r_ch.f32" 8 &&
    r=$("$PY" tests/vision_ref.py cmp "$TMP/r_ch.f32" "$TMP/c_ch.f32"); then
    pass logits_after_image_chunked_exact
else
    fail logits_after_image_chunked_exact "${r:-$(head -c 300 "$TMP/err")}"
fi

# ---- image files end to end: ds41 image -m DIR FILE, ds41 run --image ----
# The tinyvl weights under a config with room for an image (512 positions; images planned to at
# most 40 positions from min_pixels 1764) and the tiny byte-level tokenizer. The pixels come from
# `ds41 image --dump-pixels`, which tests/image_test.py holds equal to Pillow; here the tower,
# the placement and the language model are checked against the reference.
FCK=$TMP/vlfile
vl_files "$VCK" "$FCK"
"$PY" - "$TMP" <<'PYEOF'
import sys
from PIL import Image, ImageDraw
t = sys.argv[1]
a = Image.new("RGB", (150, 100), (20, 200, 40))
ImageDraw.Draw(a).ellipse((30, 20, 90, 80), fill=(220, 30, 30))
a.save(t + "/a.png")
b = Image.new("RGB", (90, 120), (0, 0, 250))
ImageDraw.Draw(b).rectangle((10, 10, 50, 70), fill=(250, 250, 0))
b.save(t + "/b.jpg", quality=90)
# the same sizes, other pictures (the prefix cache's misses)
ImageDraw.Draw(a).ellipse((50, 20, 110, 80), fill=(220, 30, 30))
a.save(t + "/c.png")
ImageDraw.Draw(b).rectangle((20, 10, 60, 70), fill=(250, 250, 0))
b.save(t + "/d.jpg", quality=90)
PYEOF
"$DS41" image -m "$FCK" --json --dump-pixels "$TMP/fpx.bin" "$TMP/a.png" >"$TMP/plan.json" 2>"$TMP/err"
read -r FH FW < <("$PY" -c "import json,sys; d=json.loads(open(sys.argv[1]).readline()); print(d['padded_height'], d['padded_width'])" "$TMP/plan.json")
"$PY" tests/vision_ref.py span "$FCK" "$TMP/fpx.bin" "$FH" "$FW" "$TMP/fref.f32"
if "$DS41" image -m "$FCK" --exact --dump "$TMP/fspan.f32" "$TMP/a.png" >"$TMP/out" 2>"$TMP/err" &&
    grep -q "^tokens         17 = 12 image" "$TMP/out" && grep -q "span 17 positions" "$TMP/out" &&
    r=$("$PY" tests/vision_ref.py cmp "$TMP/fref.f32" "$TMP/fspan.f32"); then
    pass image_file_span_exact
else
    fail image_file_span_exact "${r:-$(head -c 300 "$TMP/err") $(cat "$TMP/out")}"
fi
# the image in place of image_token_id 500 in --prompt-ids (the prompt of vision_ref.py logits:
# 1, 8, 15, the span, 3, 14), two greedy steps: the logits rows bit for bit
"$PY" tests/vision_ref.py logits "$FCK" "$TMP/fpx.bin" "$FH" "$FW" 3 2 3 "$TMP/frl.f32"
if "$DS41" run -m "$FCK" --image "$TMP/a.png" --prompt-ids 1,8,15,500,3,14 -n 3 --exact --spec off \
    --dump-logits "$TMP/fcl.f32" >/dev/null 2>"$TMP/err" && r=$("$PY" tests/vision_ref.py cmp "$TMP/frl.f32" "$TMP/fcl.f32"); then
    pass run_image_logits_exact
else
    fail run_image_logits_exact "${r:-$(head -c 300 "$TMP/err")}"
fi
# -p TEXT: each <｜deepseek_image｜> takes the next --image, the text around it tokenized as
# pieces (the same ids as the ids list written by hand); without a placeholder the images go
# in front, each followed by a blank line
PH='<｜deepseek_image｜>'
runlg() { "$DS41" run -m "$FCK" -n 2 --exact --spec off --dump-logits "$@" >/dev/null 2>>"$TMP/err"; }
ids_of() { "$DS41" tokenize -m "$FCK" --no-bos -- "$1" | tr ' ' ','; }
P1=$(ids_of "Look at ") P2=$(ids_of " and ") P3=$(ids_of ".")
: >"$TMP/err"
if runlg "$TMP/t1.f32" --image "$TMP/a.png" --image "$TMP/b.jpg" -p "Look at ${PH} and ${PH}." &&
    runlg "$TMP/t2.f32" --image "$TMP/a.png" --image "$TMP/b.jpg" --prompt-ids "0,$P1,500,$P2,500,$P3" &&
    cmp -s "$TMP/t1.f32" "$TMP/t2.f32"; then
    pass run_image_placeholders
else
    fail run_image_placeholders "$(head -c 300 "$TMP/err")"
fi
if runlg "$TMP/t3.f32" --image "$TMP/b.jpg" -p "What colour?" &&
    runlg "$TMP/t4.f32" --image "$TMP/b.jpg" -p "${PH}"$'\n\n'"What colour?" && cmp -s "$TMP/t3.f32" "$TMP/t4.f32" &&
    runlg "$TMP/t5.f32" --image "$TMP/a.png" -p "What colour?" && ! cmp -s "$TMP/t3.f32" "$TMP/t5.f32"; then
    pass run_image_default_place
else
    fail run_image_default_place "$(head -c 300 "$TMP/err")"
fi
# ds41 chat: /image FILE attaches the image to the next message; the answer equals ds41 run on
# the rendering of that turn (a user message whose image part comes first), token for token
printf '/image %s\nWhat colour?\n' "$TMP/b.jpg" | "$DS41" chat -m "$FCK" -n 8 --exact --spec off >"$TMP/chat.out" 2>"$TMP/err"
"$DS41" run -m "$FCK" --image "$TMP/b.jpg" -p "<｜User｜>${PH}"$'\n\n'"What colour?<｜Assistant｜></think>" -n 8 --exact \
    --spec off >"$TMP/run.out" 2>>"$TMP/err"
if [ -s "$TMP/chat.out" ] && cmp -s "$TMP/chat.out" "$TMP/run.out"; then pass chat_image_equals_run
else fail chat_image_equals_run "$(od -c "$TMP/chat.out" | head -3) vs $(od -c "$TMP/run.out" | head -3) $(head -c 200 "$TMP/err")"; fi
printf 'see %s here\n' "$PH" | "$DS41" chat -m "$FCK" -n 2 --exact --spec off >/dev/null 2>"$TMP/err"
if grep -q "attach images with /image FILE" "$TMP/err"; then pass chat_typed_placeholder
else fail chat_typed_placeholder "$(head -c 200 "$TMP/err")"; fi
# an answer that generated the placeholder token (this tiny model's first answer to "hi" after
# the image starts with it) has no image there: the next turns render without it, so the count
# of placeholders still matches the images (a failed /image attaches nothing)
printf '/image %s\nhi\n/image %s\n/image %s\nmore\n/reset\nagain\n' "$TMP/b.jpg" "$TMP/nope.png" "$TMP/a.png" |
    "$DS41" chat -m "$FCK" -n 2 --exact --spec off >"$TMP/chat.out" 2>"$TMP/err"
rc=$?
if [ $rc -eq 0 ] && [ "$(wc -l <"$TMP/chat.out")" -eq 3 ] && grep -q "$PH" "$TMP/chat.out" && grep -q "nope.png: cannot open" "$TMP/err" &&
    ! grep -q "placeholders but" "$TMP/err"; then
    pass chat_image_turns
else
    fail chat_image_turns "status $rc, $(wc -l <"$TMP/chat.out") answers: $(head -c 300 "$TMP/err")"
fi
exp_run() {   # NAME PATTERN ARGS...
    local name=$1 pat=$2; shift 2
    "$DS41" run "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
    local rc=$?
    if [ $rc -eq 0 ] || ! grep -qi -- "$pat" "$TMP/err"; then fail "$name" "status $rc: $(head -c 200 "$TMP/err")"
    else pass "$name"; fi
}
exp_run err_run_count "has 2 image placeholders but 1 image was given" -m "$FCK" --image "$TMP/a.png" -p "${PH}${PH}"
exp_run err_run_ids_count "--prompt-ids has 0 image placeholders but 1 image" -m "$FCK" --image "$TMP/a.png" --prompt-ids 1,2
head -c 200 "$TMP/a.png" >"$TMP/trunc.png"
exp_run err_run_truncated "trunc.png: .*truncated" -m "$FCK" --image "$TMP/trunc.png" -p hi
# ---- the image-keyed prefix cache through ds41 run --image --cache-dir (docs/prefix-cache.md):
# a prompt of 283 positions, image a (17 positions) at 1, image b at 187, so block 0 holds a and
# block 1 holds b inside the exact replay's rows [165, 256) (W 16, 6 layers: 91 rows). A second
# run restores 256 tokens and its logits equal the cold run's bit for bit (exact mode), with
# DSpark speculation too (every draft's confidence logits in --json); a different image of the
# same size in block 0 restores nothing, one in block 1 restores block 0 only; damaged block
# files are misses, and the answer is still the cold one.
CTXT=$(printf 'The first picture shows a shape on a plain background; describe it in words. %.0s' 1 2 3 4)
CP="${PH}${CTXT:0:290}${PH} and now the second picture: what colour is the shape, and where is it? Answer briefly, in one short sentence, and name the colour of the background too."
crun() {   # OUT IMG1 IMG2 [ARGS...]: greedy, exact, logits to OUT, stderr to OUT.err
    local out=$1 i1=$2 i2=$3; shift 3
    "$DS41" run -m "$FCK" --image "$i1" --image "$i2" -p "$CP" -n 4 --exact --spec off --dump-logits "$out" "$@" \
        >/dev/null 2>"$out.err"
}
restored() { sed -n 's/.*prefix cache: \([0-9]*\) of \([0-9]*\) prompt tokens restored.*/\1 \2/p' "$1.err"; }
PC=$TMP/pcache
crun "$TMP/k0" "$TMP/a.png" "$TMP/b.jpg"
if crun "$TMP/k1" "$TMP/a.png" "$TMP/b.jpg" --cache-dir "$PC" && [ "$(restored "$TMP/k1")" = "0 283" ] &&
    crun "$TMP/k2" "$TMP/a.png" "$TMP/b.jpg" --cache-dir "$PC" && [ "$(restored "$TMP/k2")" = "256 283" ] &&
    cmp -s "$TMP/k0" "$TMP/k1" && cmp -s "$TMP/k0" "$TMP/k2"; then
    pass run_image_cache_hit_exact
else
    fail run_image_cache_hit_exact "restored '$(restored "$TMP/k1")', '$(restored "$TMP/k2")' $(head -c 300 "$TMP/k2.err")"
fi
# DSpark on: speculative decoding with 2 drafts a step, every proposal's confidence in --json
sjson() { "$DS41" run -m "$FCK" --image "$TMP/a.png" --image "$TMP/b.jpg" -p "$CP" -n 12 --exact --spec fixed:2 --json "$@" \
    2>/dev/null | grep -v '"timing"'; }
if sjson >"$TMP/s0" && sjson --cache-dir "$TMP/pcs" >"$TMP/s1" && sjson --cache-dir "$TMP/pcs" >"$TMP/s2" &&
    grep -q '"conf"' "$TMP/s0" && cmp -s "$TMP/s0" "$TMP/s1" && cmp -s "$TMP/s0" "$TMP/s2" &&
    [ "$(ls "$TMP/pcs"/*/*.blk | wc -l)" -eq 2 ]; then
    pass run_image_cache_hit_dspark
else
    fail run_image_cache_hit_dspark "the speculative answer or its drafts differ after a restore"
fi
# another image of the same size: in block 0 nothing is restored, in block 1 block 0 is
crun "$TMP/kc0" "$TMP/c.png" "$TMP/b.jpg"
crun "$TMP/kd0" "$TMP/a.png" "$TMP/d.jpg"
if crun "$TMP/kc1" "$TMP/c.png" "$TMP/b.jpg" --cache-dir "$PC" && [ "$(restored "$TMP/kc1")" = "0 283" ] &&
    crun "$TMP/kd1" "$TMP/a.png" "$TMP/d.jpg" --cache-dir "$PC" && [ "$(restored "$TMP/kd1")" = "128 283" ] &&
    cmp -s "$TMP/kc0" "$TMP/kc1" && cmp -s "$TMP/kd0" "$TMP/kd1" && ! cmp -s "$TMP/k0" "$TMP/kc0" && ! cmp -s "$TMP/k0" "$TMP/kd0"; then
    pass run_image_cache_other_image
else
    fail run_image_cache_other_image "restored '$(restored "$TMP/kc1")', '$(restored "$TMP/kd1")' $(head -c 300 "$TMP/kd1.err")"
fi
# a damaged entry: one byte of every block file's payload flipped; a miss, the cold answer
for f in "$PC"/*/*.blk; do
    "$PY" -c "import sys; b = bytearray(open(sys.argv[1], 'rb').read()); b[len(b) // 2] ^= 0x40; open(sys.argv[1], 'wb').write(b)" "$f"
done
if crun "$TMP/k3" "$TMP/a.png" "$TMP/b.jpg" --cache-dir "$PC" && [ "$(restored "$TMP/k3")" = "0 283" ] && cmp -s "$TMP/k0" "$TMP/k3"; then
    pass run_image_cache_damaged
else
    fail run_image_cache_damaged "restored '$(restored "$TMP/k3")' $(head -c 300 "$TMP/k3.err")"
fi
if [ -n "${NOV:=$(checkpoint tiny 2>/dev/null)}" ]; then
    exp_run err_run_no_tower "no vision tower" -m "$NOV" --image "$TMP/a.png" --prompt-ids 1,500
fi

# ---- images through ds41 serve: an image_url part with a PNG data URL on
# /v1/chat/completions; the greedy answer in exact mode equals ds41 run --image on the same
# PNG and the template's rendering (image part first, then the text), token for token, and
# usage.prompt_tokens counts the 17 span positions; malformed parts get a 400 naming them
vreq() {   # PORT IMAGE_FILE|- MIME|URL OUT: POSTs one user message (image part, "What colour?")
    "$PY" - "$@" <<'PYEOF'
import base64, json, os, sys, urllib.request, urllib.error
port, img, mime, out = sys.argv[1:5]
url = mime if img == "-" else "data:%s;base64,%s" % (mime, base64.b64encode(open(img, "rb").read()).decode())
body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                  {"type": "text", "text": os.environ.get("VQ", "What colour?")}]}],
        "max_tokens": 8, "temperature": 0, "skip_special_tokens": False}
rq = urllib.request.Request("http://127.0.0.1:%s/v1/chat/completions" % port, json.dumps(body).encode(),
                            {"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(rq) as r: code, data = r.status, r.read()
except urllib.error.HTTPError as e:
    code, data = e.code, e.read()
open(out, "wb").write(b"%d " % code + data)
PYEOF
}
vcheck() {   # NAME IMAGE_FILE MIME: the server's answer and usage against ds41 run --image
    "$DS41" run -m "$FCK" --image "$2" -p "<｜User｜>${PH}"$'\n\n'"What colour?<｜Assistant｜></think>" -n 8 --exact \
        --spec off >"$TMP/vrun.out" 2>"$TMP/err"
    vreq "$PORT" "$2" "$3" "$TMP/v1.json"
    # usage: BOS and "<｜User｜>", the span positions (as ds41 image counts them), the text
    local r rows
    rows=$("$DS41" image -m "$FCK" "$2" 2>/dev/null | sed -n 's/.*span \([0-9]*\) positions.*/\1/p')
    r=$("$PY" -c "
import json, sys
code, _, body = open(sys.argv[1]).read().partition(' ')
d = json.loads(body)
run = open(sys.argv[2]).read()
ok = code == '200' and d['choices'][0]['message']['content'] == run.rstrip('\n') and d['usage']['prompt_tokens'] == int(sys.argv[3])
print('ok' if ok and run.strip() else 'status %s, %r vs run %r, usage %s' % (code, d.get('choices', [{}])[0].get('message'), run, d.get('usage')))
" "$TMP/v1.json" "$TMP/vrun.out" "$((NPT + ${rows:-0}))")
    if [ "$r" = ok ]; then pass "$1"; else fail "$1" "$r $(head -c 300 "$TMP/v1.json") $(head -c 200 "$TMP/err")"; fi
    cp "$TMP/vrun.out" "$TMP/$1.out"
}
if serve_start vserve -m "$FCK" --exact --spec off -c 512; then
    NPT=$(($("$DS41" tokenize -m "$FCK" -- "<｜User｜>" | wc -w) +
        $("$DS41" tokenize -m "$FCK" --no-bos -- $'\n\n'"What colour?<｜Assistant｜></think>" | wc -w)))
    vcheck serve_image_png_equals_run "$TMP/a.png" image/png
    vcheck serve_image_jpeg_equals_run "$TMP/b.jpg" image/jpeg
    # the two images answer differently: the embeddings reach the model
    if ! cmp -s "$TMP/serve_image_png_equals_run.out" "$TMP/serve_image_jpeg_equals_run.out"; then pass serve_image_differs
    else fail serve_image_differs "the PNG and the JPEG answer alike"; fi
    # the official SDKs: chat.completions and responses (openai), messages and count_tokens
    # (@anthropic-ai/sdk), each equal to ds41 run --image, usage the span positions; malformed
    # image parts and a context overflowed by the spans (tests/serve/vision_sdk.mjs)
    if [ -d tests/oracle/node_modules/openai ] && [ -d tests/oracle/node_modules/@anthropic-ai/sdk ]; then
        rows=$("$DS41" image -m "$FCK" "$TMP/a.png" 2>/dev/null | sed -n 's/.*span \([0-9]*\) positions.*/\1/p')
        timeout 120 node tests/serve/vision_sdk.mjs "$PORT" 512 "$TMP/a.png" "$TMP/serve_image_png_equals_run.out" "$TMP/b.jpg" \
            "$TMP/serve_image_jpeg_equals_run.out" "$((NPT + ${rows:-0}))" || echo "FAIL vision_sdk: exit status $?"
    else
        fail vision_sdk "tests/oracle/node_modules (openai, @anthropic-ai/sdk) missing (run make setup)"
    fi
    # the prefix cache (on by default): a longer question (194 positions) about the same
    # picture again restores its whole block and answers as ds41 run; another picture of the same
    # size restores nothing (its span is in block 0) and answers as ds41 run on it
    LQ="${CTXT:0:280} What colour?"
    cq() {   # NAME IMAGE OUT CACHED: the answer equals ds41 run, usage's cached tokens == CACHED
        "$DS41" run -m "$FCK" --image "$2" -p "<｜User｜>${PH}"$'\n\n'"${LQ}<｜Assistant｜></think>" -n 8 --exact \
            --spec off >"$TMP/cq.run" 2>"$TMP/err"
        VQ="$LQ" vreq "$PORT" "$2" image/png "$3"
        local r
        r=$("$PY" -c "
import json, sys
code, _, body = open(sys.argv[1]).read().partition(' ')
d = json.loads(body)
run = open(sys.argv[2]).read()
c = d['usage'].get('prompt_tokens_details', {}).get('cached_tokens')
ok = code == '200' and d['choices'][0]['message']['content'] == run.rstrip('\n') and c == int(sys.argv[3])
print('ok' if ok and run.strip() else 'status %s, %r vs run %r, cached %s' % (code, d.get('choices', [{}])[0].get('message'), run, c))
" "$3" "$TMP/cq.run" "$4")
        if [ "$r" = ok ]; then pass "$1"; else fail "$1" "$r $(head -c 200 "$TMP/err")"; fi
    }
    cq serve_image_cache_cold "$TMP/a.png" "$TMP/q1.json" 0
    cq serve_image_cache_hit "$TMP/a.png" "$TMP/q2.json" 128
    cq serve_image_cache_other_image "$TMP/c.png" "$TMP/q3.json" 0
    # three malformed parts: an https URL (never fetched), bad base64, a JPEG under the PNG MIME type
    vreq "$PORT" - "https://example.com/a.png" "$TMP/v2.json"
    vreq "$PORT" - "data:image/png;base64,iVBO*w0K" "$TMP/v3.json"
    vreq "$PORT" "$TMP/b.jpg" image/png "$TMP/v4.json"
    for c in "v2 image_url.url: http(s) URLs are not fetched" "v3 not in the alphabet" "v4 the data is not a PNG file"; do
        f=${c%% *} pat=${c#* }
        if grep -q '^400 ' "$TMP/$f.json" && grep -q "content\[0\]" "$TMP/$f.json" && grep -qF "$pat" "$TMP/$f.json"; then
            pass "serve_image_400_$f"
        else fail "serve_image_400_$f" "$(head -c 300 "$TMP/$f.json")"; fi
    done
    kill "$PID"; wait "$PID" 2>/dev/null
fi
# --kv-budget counts the span too: under a budget smaller than any sequence every request is
# refused with the bytes it needs, whole 128-position pages. The PNG's prompt (NPT + 17
# positions) with max_tokens filling one page and one more must need what 32 and 129 positions
# of token ids need on /v1/completions (counting the image as one position would need one page
# for both)
if serve_start vserve_budget -m "$FCK" --exact --spec off -c 512 --kv-budget 1000; then
    r=$("$PY" - "$PORT" "$TMP/a.png" "$NPT" <<'PYEOF'
import base64, json, re, sys, urllib.request, urllib.error
port, img, npt = sys.argv[1], sys.argv[2], int(sys.argv[3])
def need(route, body):
    rq = urllib.request.Request("http://127.0.0.1:%s%s" % (port, route), json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(rq)
        return "accepted"
    except urllib.error.HTTPError as e:
        m = re.search(r"needs (\d+) bytes", e.read().decode())
        return int(m.group(1)) if e.code == 400 and m else "status %d" % e.code
url = "data:image/png;base64," + base64.b64encode(open(img, "rb").read()).decode()
n = npt + 17
got = []
for mt in (128 - n, 129 - n):
    im = need("/v1/chat/completions", {"max_tokens": mt, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What colour?"}]}]})
    ids = need("/v1/completions", {"max_tokens": mt, "prompt": [7] * n})
    got.append((im, ids))
ok = all(isinstance(a, int) and a == b for a, b in got) and got[1][0] > got[0][0]
print("ok" if ok else "image vs ids, one page and two: %s" % got)
PYEOF
)
    if [ "$r" = ok ]; then pass serve_image_kv_budget; else fail serve_image_kv_budget "$r"; fi
    kill "$PID"; wait "$PID" 2>/dev/null
fi
# the image embedding cache (--image-cache, here room for exactly one span): the same picture
# again takes its rows from the cache, no tower (ds41:images_reused_total counts it,
# images_encoded_total does not), and its prefix-cache hit replays with those rows, equal to
# ds41 run; another picture of the same size runs the tower (same size, other content key)
# and evicts the first, which then runs the tower again. Each answer equals ds41 run.
"$DS41" image -m "$FCK" "$TMP/a.png" --dump "$TMP/a.span" >/dev/null 2>&1
if [ -s "$TMP/a.span" ] && serve_start vserve_icache -m "$FCK" --exact --spec off -c 512 --image-cache "$(stat -c %s "$TMP/a.span")"; then
    ic() {   # NAME IMAGE CACHED ENCODED REUSED EVICTED: cq, then the image cache's counters
        cq "$1" "$2" "$TMP/$1.json" "$3"
        local m
        m=$("$PY" -c "
import re, sys, urllib.request
t = urllib.request.urlopen('http://127.0.0.1:%s/metrics' % sys.argv[1]).read().decode()
v = lambda n: re.search(r'^ds41:%s\{[^}]*\} (\S+)' % n, t, re.M)
print(' '.join(str(int(float(v(n).group(1)))) if v(n) else '-' for n in
               ('images_encoded_total', 'images_reused_total', 'image_cache_evictions_total', 'image_cache_entries')))" "$PORT")
        if [ "$m" = "$4 $5 $6 1" ]; then pass "$1_counters"
        else fail "$1_counters" "encoded, reused, evicted, entries: '$m', expected '$4 $5 $6 1'"; fi
    }
    ic serve_image_embed_cold "$TMP/a.png" 0 1 0 0
    ic serve_image_embed_hit_no_tower "$TMP/a.png" 128 1 1 0
    ic serve_image_embed_same_size "$TMP/c.png" 0 2 1 1
    ic serve_image_embed_evicted "$TMP/a.png" 128 3 1 2
    kill "$PID"; wait "$PID" 2>/dev/null
fi
# a checkpoint without a tower (its config has a vision_config, its weights no tower): a 400
if [ -n "${NOV:=$(checkpoint tiny 2>/dev/null)}" ] && serve_start vserve_notower -m "$NOV"; then
    vreq "$PORT" "$TMP/a.png" image/png "$TMP/v5.json"
    if grep -q '^400 ' "$TMP/v5.json" && grep -q "need a checkpoint with a vision tower" "$TMP/v5.json"; then pass serve_image_400_no_tower
    else fail serve_image_400_no_tower "$(head -c 300 "$TMP/v5.json")"; fi
    kill "$PID"; wait "$PID" 2>/dev/null
fi

# ---- errors ----
expect() {   # NAME PATTERN ARGS...: exit status 1 or 2 and a message matching PATTERN
    local name=$1 pat=$2; shift 2
    "$DS41" image "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
    local rc=$?
    if [ $rc -eq 0 ] || ! grep -qi -- "$pat" "$TMP/err"; then fail "$name" "status $rc: $(head -c 200 "$TMP/err")"
    else pass "$name"; fi
}
head -c 1000 "$TMP/px.bin" >"$TMP/short.bin"
expect err_short "too short" -m "$VCK" --pixels "$TMP/short.bin" --width 140 --height 126
expect err_long "too long" -m "$VCK" --pixels "$TMP/px.bin" --width 126 --height 126
expect err_patch "multiples of the patch size 14" -m "$VCK" --pixels "$TMP/px.bin" --width 141 --height 126
expect err_args "required" -m "$VCK" --pixels "$TMP/px.bin"
NOV=$(checkpoint tiny 2>/dev/null) || NOV=
if [ -n "$NOV" ]; then expect err_no_tower "no vision tower" -m "$NOV" --pixels "$TMP/px.bin" --width 140 --height 126; fi
# a misshaped and a missing vision tensor, named
"$PY" - "$VCK" "$TMP" <<'PYEOF'
import json, os, shutil, struct, sys
src, tmp = sys.argv[1], sys.argv[2]
raw = open(os.path.join(src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
for name, edit in (("bad", "shape"), ("miss", "drop")):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    shutil.copy(os.path.join(src, "config.json"), d)
    shutil.copy(os.path.join(src, "engram_token_map.i32"), d)
    h = json.loads(json.dumps(head))
    t = "vision.blocks.1.attn.wo.bias"
    if edit == "shape":
        h[t]["shape"] = [h[t]["shape"][0] // 2, 2]
    else:
        h["unexpected." + t] = h.pop(t)
    hb = json.dumps(h).encode()
    hb += b" " * (-len(hb) % 8)
    open(os.path.join(d, "model.safetensors"), "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
PYEOF
expect err_misshaped "vision.blocks.1.attn.wo.bias: expected BF16 \[64\], found BF16 \[32, 2\]" -m "$TMP/bad" --pixels "$TMP/px.bin" --width 140 --height 126
expect err_missing "vision.blocks.1.attn.wo.bias: missing" -m "$TMP/miss" --pixels "$TMP/px.bin" --width 140 --height 126
