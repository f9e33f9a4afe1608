#!/usr/bin/env bash
# ds41 bench --configs (the four configurations: CED and CSA2 on/off; docs/performance.md) on
# the small43 checkpoint (the production layer plan at dim 256), a 250-token prompt and 6
# greedy steps in exact mode:
#   - the table: four rows in order, seven figures each, the ratio block (first row all 1.000),
#     the note that the CSA2-less row is a twin whose numbers are not a model's;
#   - exact invariants from ds41 inspect's per-token figures: KV bytes held = tokens x bytes
#     per token, 175 B with CSA2 (inspect's global KV per token) and, in the twin, each
#     compressed layer's own entries (entry bytes / ratio, summed over the 38 compressed
#     layers); the twin holds more; the full-state cache = KV + the bounded state (+ the twin's
#     extra ratio-2 compressor states); ds41's prefix store = the whole 128-token blocks;
#   - CED is exact in both plans (CED only = neither, CED + CSA2 = CSA2 only, token for token),
#     and the CSA2 rows give the tokens of ds41 run --exact --spec off (full and ced), so the
#     twin, turned on and off before them, leaves the ordinary path unchanged;
#   - usage errors name the flag.
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./build/ds41}
PY=${PYTHON:-/usr/bin/python3}
CK=build/test-ck
TMP=$(mktemp -d /tmp/ds41-configs.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$CK"
. tests/lib.sh
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

ck=$(checkpoint small43) || exit 1
N=250 D=6   # 256 tokens at the end: two whole prefix-cache blocks, an even count (ratio-2 entries exact)

# ---- the table
if "$DS41" bench --configs -m "$ck" -p 130 -n 2 >"$TMP/table.txt" 2>"$TMP/table.err"; then
    got=$("$PY" - "$TMP/table.txt" <<'EOF'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
names = ["neither", "CED only", "CSA2 only", "CED + CSA2"]
num = r"\s+([0-9.]+)"
def rows(start):
    out = []
    for name in names:
        m = re.fullmatch(re.escape(name) + num * 7, lines[start + len(out)].rstrip())
        if not m: return None
        out.append([float(x) for x in m.groups()])
    return out
try:
    assert lines[0].startswith("four configurations: 130 prompt tokens, 2 decoded"), "title: " + lines[0]
    assert lines[1].split()[:3] == ["config", "prefill", "s"], "header: " + lines[1]
    a = rows(2)
    assert a, "value rows: %r" % lines[2:6]
    assert all(v > 0 for r in a for v in r), "a non-positive figure"
    assert lines[6] == "ratio to the first row", lines[6]
    r = rows(8)
    assert r, "ratio rows: %r" % lines[8:12]
    assert r[0] == [1.0] * 7, "first ratio row %r" % r[0]
    assert abs(r[3][3] - a[3][3] / a[0][3]) < 1e-3, "KV ratio"
    text = "\n".join(lines[12:])
    assert "cost-faithful twin" in text and "not a model's" in text, "no twin note"
    print("ok")
except (AssertionError, IndexError) as e:
    print("bad:", e)
EOF
)
    [ "$got" = ok ] && pass configs_table || fail configs_table "$got"
else
    fail configs_table "exit $?: $(head -c 300 "$TMP/table.err")"
fi

# ---- invariants and tokens (JSON)
"$DS41" inspect --json "$ck" >"$TMP/inspect.json" 2>"$TMP/inspect.err" || fail configs_inspect "$(head -c 300 "$TMP/inspect.err")"
if "$DS41" bench --configs -m "$ck" -p $N -n $D --exact --json >"$TMP/c.json" 2>"$TMP/c.err"; then
    "$PY" - "$TMP/c.json" "$TMP/inspect.json" $N $D >"$TMP/checks.txt" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1])); ins = json.load(open(sys.argv[2]))
n, nd = int(sys.argv[3]), int(sys.argv[4])
tok = n + nd
c = {r["config"]: r for r in d["configs"]}
def check(name, ok, why):
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + why))
names = [r["config"] for r in d["configs"]]
check("configs_json_rows", names == ["neither", "CED only", "CSA2 only", "CED + CSA2"]
      and [(r["ced"], r["csa2"]) for r in d["configs"]] == [(False, False), (True, False), (False, True), (True, True)],
      repr(names))
# per-token arithmetic: one entry of a KV source holds e bytes for r tokens; the model's 4
# sources give inspect's figure, the twin's compressed layers (every layer with ratio > 0) theirs
layers = [l for l in ins["layers"] if l["part"] != "draft"]
src = [l for l in layers if l["kv_source"] == l["id"]]
comp = [l for l in layers if l["ratio"] > 0]
e = ins["global_kv_bytes_per_token"] / sum(1.0 / l["ratio"] for l in src)
twin = e * sum(1.0 / l["ratio"] for l in comp)
check("configs_kv_per_token_csa2", all(c[k]["kv_bytes_per_token"] == ins["global_kv_bytes_per_token"]
      and c[k]["kv_bytes"] == ins["global_kv_bytes_per_token"] * tok for k in ("CSA2 only", "CED + CSA2")),
      "%r vs %r x %d" % ([c[k]["kv_bytes"] for k in c], ins["global_kv_bytes_per_token"], tok))
check("configs_kv_per_token_twin", len(comp) == 38 and twin == 2030.0 and all(c[k]["kv_bytes_per_token"] == twin
      and c[k]["kv_bytes"] == twin * tok for k in ("neither", "CED only")),
      "%d compressed layers, %r B/token expected, got %r" % (len(comp), twin, [c[k]["kv_bytes"] for k in c]))
check("configs_twin_holds_more", c["neither"]["kv_bytes"] > c["CSA2 only"]["kv_bytes"] > 0, "")
# the full-state cache: KV + the bounded state; the twin adds a compressor state per ratio-2 layer
per_state = ins["compressor_state_bytes"] / sum(1 for l in src if l["ratio"] > 1)
extra = per_state * (sum(1 for l in comp if l["ratio"] > 1) - sum(1 for l in src if l["ratio"] > 1))
check("configs_full_state", c["CSA2 only"]["prefix_bytes"] == c["CSA2 only"]["kv_bytes"] + ins["bounded_state_bytes"]
      and all(c[k]["prefix_bytes"] == c[k]["kv_bytes"] + ins["bounded_state_bytes"] + extra for k in ("neither", "CED only")),
      repr([(c[k]["prefix_bytes"], c[k]["kv_bytes"]) for k in c]))
check("configs_prefix_store", c["CED + CSA2"]["prefix_kind"] == "store"
      and c["CED + CSA2"]["prefix_bytes"] == (tok // 128) * 128 * ins["global_kv_bytes_per_token"],
      repr(c["CED + CSA2"]["prefix_bytes"]))
check("configs_ced_exact", c["CED only"]["tokens"] == c["neither"]["tokens"]
      and c["CED + CSA2"]["tokens"] == c["CSA2 only"]["tokens"] and len(c["neither"]["tokens"]) == nd,
      repr([c[k]["tokens"] for k in c]))
print("IDS " + ",".join(map(str, d["prompt_ids"])))
for k in ("CSA2 only", "CED + CSA2"): print("TOK %s %s" % (k.split()[0], ",".join(map(str, c[k]["tokens"]))))
EOF
    grep -E '^(PASS|FAIL) ' "$TMP/checks.txt"
    ids=$(sed -n 's/^IDS //p' "$TMP/checks.txt")
    for m in full ced; do
        want=$(sed -n "s/^TOK $([ $m = full ] && echo CSA2 || echo CED) //p" "$TMP/checks.txt")
        got=$("$DS41" run -m "$ck" --prompt-ids "$ids" -n $D --exact --spec off --prefill $m --ignore-eos --json 2>"$TMP/run.err" |
              "$PY" -c 'import json, sys; print(",".join(str(json.loads(l)["id"]) for l in sys.stdin if "\"id\"" in l))')
        [ -n "$want" ] && [ "$got" = "$want" ] && pass configs_plain_tokens_$m || fail configs_plain_tokens_$m "run '$got', bench '$want' $(head -c 200 "$TMP/run.err")"
    done
else
    fail configs_json "exit $?: $(head -c 300 "$TMP/c.err")"
fi

# ---- usage
"$DS41" bench --configs -p 100 >/dev/null 2>"$TMP/err"
[ $? = 2 ] && grep -q -- "-m DIR is required" "$TMP/err" && pass configs_usage_model || fail configs_usage_model "$(cat "$TMP/err")"
"$DS41" bench --configs -m "$ck" -p 0 >/dev/null 2>"$TMP/err"
[ $? = 2 ] && grep -q -- "-p" "$TMP/err" && pass configs_usage_prompt || fail configs_usage_prompt "$(cat "$TMP/err")"
