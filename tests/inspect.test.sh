#!/usr/bin/env bash
# End-to-end tests of `ds41 inspect`: the production config (890 / 528 and the plan of spec
# section 2), the flat spelling, usage, the malformed config corpus, and generated
# checkpoints (tools/make_checkpoint.py) that must bind with zero errors or name the bad
# tensor. Needs $DS41 (the binary) and $DS41_ROOT; JSON is checked with Debian's python3.
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./ds41}
PY=${PYTHON:-/usr/bin/python3}
TMP=${DS41_BUILD:-build}/test-inspect
rm -rf "$TMP" && mkdir -p "$TMP"

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

# --- production config, JSON ---------------------------------------------------------------
# Spec section 2, one token per layer: id:part:mode:ratio:kv_source:topk_source
expected_plan() {
    local out="" l
    for l in $(seq 0 42); do
        local part mode r kv tk
        if [ $l -ge 40 ]; then part=draft mode=draft r=0 kv=null tk=null
        elif [ $l -le 1 ]; then part=encoder mode=swa r=0 kv=null tk=null
        elif [ $l -le 19 ]; then
            part=encoder r=2; kv=$(( l < 8 ? 2 : l < 14 ? 8 : 14 )); tk=$kv
            case $l in 2|8|14) mode=full ;; *) mode=reuse ;; esac
        else
            part=decoder r=1 kv=20
            tk=$(( l < 24 ? 20 : l < 28 ? 24 : l < 32 ? 28 : l < 36 ? 32 : 36 ))
            case $l in 20) mode=full ;; 24|28|32|36) mode=reindex ;; *) mode=reuse ;; esac
        fi
        out="$out $l:$part:$mode:$r:$kv:$tk"
    done
    echo "${out# }"
}

if "$DS41" inspect --json models/production >"$TMP/prod.json" 2>"$TMP/prod.err"; then
    got=$("$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
n = lambda v: "null" if v is None else str(v)
print(d["global_kv_bytes_per_token"], d["global_kv_main_bytes_per_token"], d["global_kv_index_bytes_per_token"],
      d["swa_bytes_per_token_per_layer"])
print(" ".join("%d:%s:%s:%d:%s:%s" % (l["id"], l["part"], l["mode"], l["ratio"], n(l["kv_source"]), n(l["topk_source"]))
               for l in d["layers"]))
ok = [l for l in d["layers"] if l["uses_candidates"]] and all(l["uses_candidates"] == (l["id"] in (24, 28, 32, 36)) for l in d["layers"])
ok = ok and [l["id"] for l in d["layers"] if l["engram_slot"] is not None] == [1, 14]
ok = ok and [l["id"] for l in d["layers"] if l["is_candidate_source"]] == [20]
ok = ok and all((l["rope_theta"], l["yarn"]) == ((160000, True) if l["ratio"] else (10000, False)) for l in d["layers"])
ok = ok and all((l["n_experts"], l["n_active"]) == ((128, 3) if l["id"] >= 40 else (384, 6)) for l in d["layers"])
ok = ok and d["tensors"] is None and d["first_decoder_layer"] == 20
print("extras-ok" if ok else "extras-bad")
' "$TMP/prod.json" 2>&1)
    line1=$(echo "$got" | sed -n 1p); line2=$(echo "$got" | sed -n 2p); line3=$(echo "$got" | sed -n 3p)
    [ "$line1" = "890 720 170 528" ] && pass inspect_production_budgets || fail inspect_production_budgets "got '$line1'"
    [ "$line2" = "$(expected_plan)" ] && pass inspect_production_plan || fail inspect_production_plan "got '$line2'"
    [ "$line3" = "extras-ok" ] && pass inspect_production_plan_fields || fail inspect_production_plan_fields "$got"
else
    fail inspect_production_budgets "exit $?: $(head -c 300 "$TMP/prod.err")"
fi

# --- text report ------------------------------------------------------------------------------
if "$DS41" inspect models/production >"$TMP/prod.txt" 2>&1 && grep -q "global KV per token        890 B (main 720 + index 170)" "$TMP/prod.txt" &&
    grep -q "SWA per token per layer    528 B" "$TMP/prod.txt" && grep -qE "^  layers\.24 +decoder +reindex" "$TMP/prod.txt" &&
    grep -qE "^  mtp\.2 +draft" "$TMP/prod.txt"; then
    pass inspect_text_report
else
    fail inspect_text_report "$(head -c 400 "$TMP/prod.txt")"
fi

# --- the flat spelling gives the same plan and budgets ----------------------------------------
if "$DS41" inspect --json tests/configs/production-flat >"$TMP/flat.json" 2>"$TMP/flat.err" &&
    "$PY" -c '
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
keys = ["layers", "global_kv_bytes_per_token", "swa_bytes_per_token_per_layer", "bounded_state_bytes", "weight_bytes",
        "total_params", "active_params_decode", "active_params_prefill"]
sys.exit(0 if all(a[k] == b[k] for k in keys) and b["spelling"] == "flat" else 1)
' "$TMP/prod.json" "$TMP/flat.json"; then
    pass inspect_flat_equals_hf
else
    fail inspect_flat_equals_hf "$(head -c 300 "$TMP/flat.err")"
fi

# --- usage ----------------------------------------------------------------------------------
"$DS41" inspect --help >"$TMP/help.txt" 2>&1; rc=$?
[ $rc -eq 0 ] && grep -q "usage: ds41 inspect" "$TMP/help.txt" && pass inspect_help || fail inspect_help "exit $rc"
"$DS41" inspect >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && pass inspect_no_path || fail inspect_no_path "exit $rc"
"$DS41" inspect --bogus models/production >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && pass inspect_bad_option || fail inspect_bad_option "exit $rc"
"$DS41" inspect "$TMP/does-not-exist" >/dev/null 2>"$TMP/nx.err"; rc=$?
[ $rc -eq 1 ] && grep -q "does-not-exist: cannot open" "$TMP/nx.err" && pass inspect_missing_dir ||
    fail inspect_missing_dir "exit $rc: $(cat "$TMP/nx.err")"

# --- malformed config corpus: one line on stderr with the expected text, exit 1, no crash -------
n=0 bad=""
for d in tests/malformed/config/*/; do
    name=$(basename "$d")
    exp=$(cat "$d/expected")
    "$DS41" inspect "$d" >"$TMP/m.out" 2>"$TMP/m.err"; rc=$?
    n=$((n + 1))
    lines=$(wc -l <"$TMP/m.err")
    if [ $rc -ne 1 ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$exp" "$TMP/m.err" || [ -s "$TMP/m.out" ]; then
        bad="$bad $name(exit $rc, $lines lines: $(head -c 200 "$TMP/m.err"))"
    fi
done
[ -z "$bad" ] && [ $n -ge 12 ] && pass "inspect_malformed_config_corpus ($n cases)" || fail inspect_malformed_config_corpus "$n cases;$bad"

# --- generated checkpoints bind with zero errors ------------------------------------------------
check_bind() {  # name config-dir [make_checkpoint args]
    local name=$1 cfg=$2; shift 2
    local out="$TMP/$name"
    if ! "$PY" tools/make_checkpoint.py "$cfg" "$out" "$@" >"$TMP/$name.gen" 2>&1; then
        fail "inspect_bind_$name" "make_checkpoint: $(tail -c 300 "$TMP/$name.gen")"; return
    fi
    "$DS41" inspect --json "$out" >"$TMP/$name.json" 2>"$TMP/$name.err"; local rc=$?
    local got
    got=$("$PY" -c '
import json, sys
t = json.load(open(sys.argv[1]))["tensors"]
print(t["missing"], t["misshaped"], t["unexpected"], t["bound"] == t["expected"] == t["count"] - t["vision"])
' "$TMP/$name.json" 2>&1)
    [ $rc -eq 0 ] && [ "$got" = "0 0 0 True" ] && pass "inspect_bind_$name" ||
        fail "inspect_bind_$name" "exit $rc, '$got', $(head -c 300 "$TMP/$name.err")"
}
if [ -f tools/make_checkpoint.py ]; then
    check_bind tiny tests/configs/tiny
    check_bind tiny_sharded tests/configs/tiny --shards 3
    [ -f tests/configs/small43/config.json ] && check_bind small43 tests/configs/small43

    # a tensor of the wrong shape (same byte size, dims swapped): exit 1, error names it
    cp -r "$TMP/tiny" "$TMP/tiny_bad"
    if "$PY" - "$TMP/tiny_bad/model.safetensors" <<'EOF'
import json, struct, sys
path = sys.argv[1]
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    s = h["layers.3.ffn.experts.1.w2.weight"]["shape"]
    h["layers.3.ffn.experts.1.w2.weight"]["shape"] = [s[1], s[0]]
    text = json.dumps(h, separators=(",", ":")).encode()
    assert len(text) <= n
    f.seek(8)
    f.write(text + b" " * (n - len(text)))
EOF
    then
        "$DS41" inspect "$TMP/tiny_bad" >/dev/null 2>"$TMP/bad.err"; rc=$?
        if [ $rc -eq 1 ] && grep -qF "tensor layers.3.ffn.experts.1.w2.weight: expected I8 [256, 64], found I8 [64, 256]" "$TMP/bad.err"; then
            pass inspect_bind_wrong_shape
        else
            fail inspect_bind_wrong_shape "exit $rc: $(cat "$TMP/bad.err")"
        fi
    else
        fail inspect_bind_wrong_shape "could not edit the header"
    fi
fi
rm -rf "$TMP"
