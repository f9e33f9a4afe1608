# Shared helpers of the shell tests (sourced; not a test itself).
# Needs: PY (python with numpy), CK (checkpoint cache dir), TMP (scratch dir).

# checkpoint NAME -> path of an up-to-date generated checkpoint of tests/configs/NAME (seed 1,
# stub Engram token map), cached in $CK/conf-NAME and rewritten when the config changes.
checkpoint() {
    local name=$1
    local dir=$CK/conf-$name
    if [ ! -f "$dir/config.json" ] || ! cmp -s "$dir/config.json" "tests/configs/$name/config.json" || [ ! -f "$dir/.complete" ]; then
        rm -rf "$dir"
        "$PY" tools/make_checkpoint.py "tests/configs/$name" "$dir" --seed 1 --token-map stub -q >"$TMP/mk.log" 2>&1 \
            || { echo "FAIL checkpoint_$name: make_checkpoint.py failed: $(tail -n 2 "$TMP/mk.log")" >&2; return 1; }
        touch "$dir/.complete"
    fi
    echo "$dir"
}

# text_checkpoint NAME -> a directory with the generated checkpoint of tests/configs/NAME
# (symlinked) and the small byte-level BPE tokenizer of tests/tiny_tokenizer.py (ids < 512),
# for the commands that need text (perplexity, chat); in $TMP/text-NAME.
text_checkpoint() {
    local ck dir=$TMP/text-$1
    ck=$(checkpoint "$1") || return 1
    mkdir -p "$dir"
    case $ck in /*) ;; *) ck=$PWD/$ck ;; esac
    for f in config.json model.safetensors engram_token_map.i32; do ln -sf "$ck/$f" "$dir/$f"; done
    "$PY" tests/tiny_tokenizer.py "$dir" || { echo "FAIL text_checkpoint_$1: tests/tiny_tokenizer.py failed" >&2; return 1; }
    echo "$dir"
}

# ids N SEED VOCAB -> N comma-separated random ids below VOCAB
ids() { "$PY" -c "import random; r=random.Random($2); print(','.join(str(r.randrange($3)) for _ in range($1)))"; }

# serve_checkpoint -> the tiny checkpoint with a 4096-position context and the byte-level BPE
# tokenizer of tests/serve/make_tokenizer.py (ds41 serve's tests), cached in $CK/serve-tiny.
serve_checkpoint() {
    local ck=$CK/serve-tiny
    mkdir -p "$TMP/cfg"
    sed 's/"max_position_embeddings": 128/"max_position_embeddings": 4096/' tests/configs/tiny/config.json >"$TMP/cfg/config.json"
    if [ ! -f "$ck/.complete" ] || ! cmp -s "$ck/config.json" "$TMP/cfg/config.json" || [ tests/serve/make_tokenizer.py -nt "$ck/.complete" ]; then
        rm -rf "$ck"
        "$PY" tools/make_checkpoint.py "$TMP/cfg" "$ck" --seed 1 --token-map stub -q >"$TMP/mk.log" 2>&1 &&
            "$PY" tests/serve/make_tokenizer.py "$ck" 500 >>"$TMP/mk.log" 2>&1 || return 1
        touch "$ck/.complete"
    fi
    echo "$ck"
}

# serve_start NAME ARGS...: `$DS41 serve --port 0 ARGS...` in the background, logging to
# $TMP/NAME.log; waits (30 s at most) for its "listening on" line; sets PORT and PID and adds
# the pid to PIDS (the caller's cleanup kills them). On failure calls the caller's `fail`.
serve_start() {
    local name=$1; shift
    "$DS41" serve --port 0 "$@" >"$TMP/$name.log" 2>&1 &
    PID=$!
    PIDS+=("$PID")
    PORT=
    for _ in $(seq 1 300); do
        PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/$name.log" 2>/dev/null)
        [ -n "$PORT" ] && break
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$PORT" ]; then fail "serve_start_$name" "$(tail -n 5 "$TMP/$name.log")"; return 1; fi
}

# vl_files VCK DIR: DIR gets the tinyvl checkpoint VCK (make_checkpoint.py --vision; symlinked)
# under a config with room for an image (512 positions; images planned to at most 40 positions
# from min_pixels 1764) and the tiny byte-level tokenizer (tests/vision.test.sh, tests/mpi.test.sh)
vl_files() {
    local abs f
    mkdir -p "$2"
    case $1 in /*) abs=$1 ;; *) abs=$PWD/$1 ;; esac
    for f in model.safetensors engram_token_map.i32; do ln -sf "$abs/$f" "$2/$f"; done
    sed -e 's/"max_position_embeddings": 128/"max_position_embeddings": 512/' -e 's/"max_image_tokens": 1024/"max_image_tokens": 40/' \
        -e 's/"min_pixels": 295936/"min_pixels": 1764/' tests/configs/tinyvl/config.json >"$2/config.json"
    "$PY" tests/tiny_tokenizer.py "$2"
}
