# Sourced by bench/vision_itl.sh and bench/vision_hit.sh (TMP, PY, BLOCKS, DS41 set). CK: a
# checkpoint with the tinyvl text model and a tower of the released block shape (D 1024, 16
# heads, I 2816) with BLOCKS of its 32 blocks, CTX positions of context (default 1024), the
# tiny tokenizer.
CTX=${CTX:-1024}
CK=$TMP/ck$BLOCKS-c$CTX
if [ ! -f "$CK/.complete" ]; then
    mkdir -p "$TMP/cfg"
    "$PY" - tests/configs/tinyvl/config.json "$TMP/cfg/config.json" "$BLOCKS" "$CTX" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["text_config"]["max_position_embeddings"] = int(sys.argv[4])
v = c["vision_config"]
v.update({"num_hidden_layers": int(sys.argv[3]), "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 2816})
json.dump(c, open(sys.argv[2], "w"), indent=1)
PYEOF
    "$PY" tools/make_checkpoint.py "$TMP/cfg" "$CK" --seed 1 --token-map stub --vision -q
    "$PY" tests/tiny_tokenizer.py "$CK"
    touch "$CK/.complete"
fi
# vserve ARGS...: ds41 serve on CK with ARGS in the background (SPID), its port in PORT
vserve() {
    "$DS41" serve -m "$CK" --port 0 "$@" >"$TMP/serve.log" 2>&1 &
    SPID=$!
    PORT=
    for _ in $(seq 1 600); do
        PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/serve.log")
        [ -n "$PORT" ] && break
        sleep 0.1
    done
    [ -n "$PORT" ] || { tail -5 "$TMP/serve.log"; exit 1; }
}
