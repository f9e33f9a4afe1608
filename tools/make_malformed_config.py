#!/usr/bin/env -S /usr/bin/python3
"""Writes the config-side malformed corpus, tests/malformed/config/NAME/{config.json,expected}.

Each case is the production config (models/production/config.json, or the flat
tests/configs/production-flat/config.json) with one defect; `expected` holds a substring the
one-line error must contain. tests/inspect.test.sh and tests/test_config.c run every case.
Re-run after changing a case:  /usr/bin/python3 tools/make_malformed_config.py
"""
import copy
import json
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "malformed", "config")

with open(os.path.join(ROOT, "models", "production", "config.json")) as f:
    HF = json.load(f)
with open(os.path.join(ROOT, "tests", "configs", "production-flat", "config.json")) as f:
    FLAT = json.load(f)

cases = []  # (name, text, expected substring)


def hf_case(name, expected, mutate):
    d = copy.deepcopy(HF)
    mutate(d, d["text_config"])
    cases.append((name, json.dumps(d, indent=1), expected))


def flat_case(name, expected, mutate):
    d = copy.deepcopy(FLAT)
    mutate(d)
    cases.append((name, json.dumps(d, indent=1), expected))


def setv(key, value):
    def m(root, t):
        t[key] = value
    return m


def delv(key):
    def m(root, t):
        del t[key]
    return m


# layer-plan consistency
hf_case("ratios-wrong-length", "text_config.compress_ratios: 42 entries, expected 43",
        lambda r, t: t.__setitem__("compress_ratios", t["compress_ratios"][:-1]))
hf_case("kv-source-ratio-zero", "text_config.kv_source_layer_ids: layer 1 has compress ratio 0",
        setv("kv_source_layer_ids", [1, 8, 14, 20]))
hf_case("index-source-ratio-zero", "text_config.index_source_layer_ids: layer 0 has compress ratio 0",
        setv("index_source_layer_ids", [0, 2, 8, 14, 20, 24, 28, 32, 36]))
hf_case("ratio-before-kv-source", "text_config.compress_ratios[1]: layer 1 has ratio 2 but no KV source",
        lambda r, t: t["compress_ratios"].__setitem__(1, 2))
hf_case("kv-sources-not-increasing", "text_config.kv_source_layer_ids: not strictly increasing",
        setv("kv_source_layer_ids", [2, 14, 8, 20]))
hf_case("index-source-out-of-range", "text_config.index_source_layer_ids[8]: layer 45 is outside 0..39",
        setv("index_source_layer_ids", [2, 8, 14, 20, 24, 28, 32, 36, 45]))
hf_case("kv-source-not-index-source", "layer 8 is not in text_config.index_source_layer_ids",
        setv("index_source_layer_ids", [2, 14, 20, 24, 28, 32, 36]))
hf_case("consumer-ratio-mismatch", "layer 5 has ratio 1 but its KV source layer 2 has ratio 2",
        lambda r, t: t["compress_ratios"].__setitem__(5, 1))
hf_case("draft-stage-ratio", "DSpark stage 40 has ratio 1",
        lambda r, t: t["compress_ratios"].__setitem__(40, 1))
hf_case("candidate-not-index-source", "text_config.candidate_source_layer_id: layer 21 is not an index source",
        setv("candidate_source_layer_id", 21))
hf_case("dspark-target-out-of-range", "text_config.dspark_target_layer_ids[2]: layer 40 is outside 0..39",
        setv("dspark_target_layer_ids", [37, 38, 40]))
hf_case("engram-count-mismatch", "text_config.engram_num_embeddings: 1 entries but",
        setv("engram_num_embeddings", [384006168]))
# block divisibility and geometry
hf_case("dim-not-multiple-of-32", "text_config.hidden_size: 5000 is not a multiple of 32", setv("hidden_size", 5000))
hf_case("q-lora-not-multiple-of-32", "text_config.q_lora_rank: 1000 is not a multiple of 32",
        setv("q_lora_rank", 1000))
hf_case("head-dim-not-multiple-of-16", "text_config.head_dim: 520 is not a multiple of 16", setv("head_dim", 520))
hf_case("moe-inter-not-multiple-of-32", "text_config.moe_intermediate_size: 2300 is not a multiple of 32",
        setv("moe_intermediate_size", 2300))
hf_case("rope-dim-odd", "text_config.qk_rope_head_dim: 63 is odd", setv("qk_rope_head_dim", 63))
hf_case("rope-dim-above-head-dim", "text_config.qk_rope_head_dim: 1024 is larger than text_config.head_dim",
        setv("qk_rope_head_dim", 1024))
hf_case("o-groups-indivisible", "is not divisible by 7 groups", setv("o_groups", 7))
hf_case("weight-block-128", "quantization_config.weight_block_size: expected [32, 32]",
        lambda r, t: r["quantization_config"].__setitem__("weight_block_size", [128, 128]))
# MoE
hf_case("unknown-scoring-func", "text_config.scoring_func: unknown scoring function 'relu'",
        setv("scoring_func", "relu"))
hf_case("topk-above-experts", "text_config.num_experts_per_tok: 6 experts per token is more than",
        setv("n_routed_experts", 4))
# absurd values
hf_case("huge-dim", "text_config.hidden_size: 9223372036854775807 is out of range",
        setv("hidden_size", 9223372036854775807))
hf_case("huge-engram-rows", "text_config.engram_num_embeddings[0]: 4611686018427387904 is out of range",
        setv("engram_num_embeddings", [4611686018427387904, 384016682]))
hf_case("negative-heads", "text_config.num_attention_heads: -64 is out of range", setv("num_attention_heads", -64))
hf_case("zero-eps", "text_config.rms_norm_eps: 0 is out of range", setv("rms_norm_eps", 0))
# missing fields, wrong types
hf_case("missing-hidden-size", "text_config.hidden_size: missing required field", delv("hidden_size"))
hf_case("missing-index-heads", "text_config.index_n_heads: missing required field (required when there is an index",
        delv("index_n_heads"))
hf_case("missing-quantization-config", "quantization_config: missing", lambda r, t: r.pop("quantization_config"))
hf_case("layers-as-string", "text_config.num_hidden_layers: expected an integer in [1, 120], got a string",
        setv("num_hidden_layers", "40"))
hf_case("head-dim-real", "text_config.head_dim: expected an integer in [1, 4096], got a real number",
        setv("head_dim", 512.5))
hf_case("list-entry-string", "text_config.kv_source_layer_ids[1]: expected an integer", setv("kv_source_layer_ids", [2, "8"]))
hf_case("too-many-engram-layers", "text_config.engram_layer_ids: 9 entries, more than the supported 8",
        setv("engram_layer_ids", list(range(9))))
hf_case("text-config-not-object", "text_config: expected an object, got an array",
        lambda r, t: r.__setitem__("text_config", [1]))
hf_case("legacy-model-type", "model_type: 'deepseek_v4', expected deepseek_v41",
        lambda r, t: r.__setitem__("model_type", "deepseek_v4"))
hf_case("expert-dtype-fp8", "quantization_config.expert_dtype: 'fp8', expected fp4",
        lambda r, t: r["quantization_config"].__setitem__("expert_dtype", "fp8"))
hf_case("rope-scaling-linear", "text_config.rope_scaling.rope_type: 'linear' is not supported",
        lambda r, t: t["rope_scaling"].__setitem__("rope_type", "linear"))
hf_case("tied-embeddings", "text_config.tie_word_embeddings: true is not supported", setv("tie_word_embeddings", True))
# the flat spelling names its own fields
flat_case("flat-ratios-wrong-length", "compress_ratios: 44 entries, expected 43 (n_layers 40 + n_mtp_layers 3)",
          lambda d: d["compress_ratios"].append(0))
flat_case("flat-missing-dim", "dim: missing required field", lambda d: d.pop("dim"))
flat_case("flat-score-func", "score_func: unknown scoring function 'tanh'", lambda d: d.__setitem__("score_func", "tanh"))

# not JSON / not a config
good = json.dumps(HF, indent=1)
cases.append(("invalid-json", good.replace('"hidden_size": 5120,', '"hidden_size": 5120,,'), "invalid JSON at line"))
cases.append(("truncated", good[: len(good) // 2], "invalid JSON at line"))
cases.append(("empty-file", "", "invalid JSON at line 1"))
cases.append(("real-overflow", good.replace('"rope_theta": 10000,', '"rope_theta": 1e400,'), "invalid JSON"))
cases.append(("duplicate-key", good.replace('"hidden_size": 5120,', '"hidden_size": 5120, "hidden_size": 4096,'),
              "duplicate object key"))
cases.append(("top-level-array", "[1, 2, 3]\n", "expected a JSON object at the top level, got an array"))
cases.append(("neither-spelling", '{"foo": 1}\n', "neither text_config"))


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    for name, text, expected in cases:
        d = os.path.join(OUT, name)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(text)
        with open(os.path.join(d, "expected"), "w") as f:
            f.write(expected + "\n")
    print(f"wrote {len(cases)} cases under {os.path.relpath(OUT, ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
