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
#     without a tower get 400s naming them.
# About 6 s.
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
exp_run err_run_cache "--image cannot be combined with --cache-dir" -m "$FCK" --image "$TMP/a.png" -p hi --cache-dir "$TMP/pc"
if [ -n "${NOV:=$(checkpoint tiny 2>/dev/null)}" ]; then
    exp_run err_run_no_tower "no vision tower" -m "$NOV" --image "$TMP/a.png" --prompt-ids 1,500
fi

# ---- images through ds41 serve: an image_url part with a PNG data URL on
# /v1/chat/completions; the greedy answer in exact mode equals ds41 run --image on the same
# PNG and the template's rendering (image part first, then the text), token for token, and
# usage.prompt_tokens counts the 17 span positions; malformed parts get a 400 naming them
vreq() {   # PORT IMAGE_FILE|- MIME|URL OUT: POSTs one user message (image part, "What colour?")
    "$PY" - "$@" <<'PYEOF'
import base64, json, sys, urllib.request, urllib.error
port, img, mime, out = sys.argv[1:5]
url = mime if img == "-" else "data:%s;base64,%s" % (mime, base64.b64encode(open(img, "rb").read()).decode())
body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                  {"type": "text", "text": "What colour?"}]}],
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
    # three malformed parts: not a data URL, bad base64, a JPEG under the PNG MIME type
    vreq "$PORT" - "https://example.com/a.png" "$TMP/v2.json"
    vreq "$PORT" - "data:image/png;base64,iVBO*w0K" "$TMP/v3.json"
    vreq "$PORT" "$TMP/b.jpg" image/png "$TMP/v4.json"
    for c in "v2 image_url.url: only data:image/png" "v3 not in the alphabet" "v4 the data is not a PNG file"; do
        f=${c%% *} pat=${c#* }
        if grep -q '^400 ' "$TMP/$f.json" && grep -q "content\[0\]" "$TMP/$f.json" && grep -qF "$pat" "$TMP/$f.json"; then
            pass "serve_image_400_$f"
        else fail "serve_image_400_$f" "$(head -c 300 "$TMP/$f.json")"; fi
    done
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
