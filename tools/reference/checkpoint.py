"""Checkpoint directories as ds41 reads them: config.json (Hugging Face spelling with text_config /
quantization_config, or the flat inference/config.json spelling), the layer plan of spec
section 2 derived from the fields, and safetensors (one file or shards listed in
model.safetensors.index.json) read through numpy memmaps of the raw bytes."""

import json
import os
import struct

import numpy as np

from formats import F32, F64, bf16_from_bits, ue8m0_decode, E4M3_TABLE64, E2M1_TABLE64
from exact import PlainWeight, BlockWeight


class CheckpointError(Exception):
    pass


# ---- config.json ----------------------------------------------------------------------------

# HF text_config key -> flat key
_HF_TO_FLAT = {
    "vocab_size": "vocab_size", "hidden_size": "dim", "num_hidden_layers": "n_layers",
    "num_nextn_predict_layers": "n_mtp_layers", "rms_norm_eps": "norm_eps",
    "num_attention_heads": "n_heads", "head_dim": "head_dim", "qk_rope_head_dim": "rope_head_dim",
    "q_lora_rank": "q_lora_rank", "o_groups": "o_groups", "o_lora_rank": "o_lora_rank",
    "sliding_window": "window_size", "rope_theta": "rope_theta",
    "compress_rope_theta": "compress_rope_theta", "compress_ratios": "compress_ratios",
    "kv_source_layer_ids": "kv_source_layers", "index_source_layer_ids": "index_source_layers",
    "candidate_source_layer_id": "candidate_source_layer",
    "candidate_topk_blocks": "candidate_topk_blocks", "candidate_block_size": "candidate_block_size",
    "index_n_heads": "index_n_heads", "index_head_dim": "index_head_dim", "index_topk": "index_topk",
    "n_routed_experts": "n_routed_experts", "n_shared_experts": "n_shared_experts",
    "num_experts_per_tok": "n_activated_experts", "moe_intermediate_size": "moe_inter_dim",
    "scoring_func": "score_func", "norm_topk_prob": "norm_topk_prob",
    "routed_scaling_factor": "route_scale", "swiglu_limit": "swiglu_limit",
    "hc_mult": "hc_mult", "hc_sinkhorn_iters": "hc_sinkhorn_iters", "hc_eps": "hc_eps",
    "engram_layer_ids": "engram_layer_ids", "engram_max_ngram_size": "engram_max_ngram_size",
    "engram_n_heads": "engram_n_heads", "engram_head_dim": "engram_head_dim",
    "engram_vocab_size": "engram_vocab_size", "engram_num_embeddings": "engram_num_embeddings",
    "engram_compressed_vocab_size": "engram_compressed_vocab_size",
    "engram_pad_token_id": "engram_pad_id",
    "dspark_block_size": "dspark_block_size", "dspark_noise_token_id": "dspark_noise_token_id",
    "dspark_target_layer_ids": "dspark_target_layer_ids", "dspark_markov_rank": "dspark_markov_rank",
    "dspark_n_routed_experts": "dspark_n_routed_experts",
    "dspark_num_experts_per_tok": "dspark_n_activated_experts",
    "gate_temp": "gate_temp",
}

_DEFAULTS = {
    "n_mtp_layers": 0, "gate_temp": 1.0, "norm_topk_prob": True, "candidate_source_layer": -1,
    "candidate_topk_blocks": 0, "candidate_block_size": 0, "engram_layer_ids": [],
    "engram_num_embeddings": [], "engram_max_ngram_size": 1, "engram_n_heads": 0,
    "engram_head_dim": 0, "engram_vocab_size": 0, "engram_compressed_vocab_size": 0,
    "engram_pad_id": 2, "dspark_block_size": 0, "dspark_noise_token_id": 0,
    "dspark_target_layer_ids": [], "dspark_markov_rank": 0, "dspark_n_routed_experts": 0,
    "dspark_n_activated_experts": 0, "original_seq_len": 0, "rope_factor": 1.0,
    "beta_fast": 32, "beta_slow": 1, "swiglu_limit": 0.0, "route_scale": 1.0,
    "score_func": "sqrtsoftplus", "n_shared_experts": 1, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "norm_eps": 1e-20, "index_topk": 0, "index_n_heads": 0, "index_head_dim": 0,
    "kv_source_layers": [], "index_source_layers": [],
}

_REQUIRED = ["vocab_size", "dim", "n_layers", "n_heads", "head_dim", "rope_head_dim",
             "q_lora_rank", "o_groups", "o_lora_rank", "window_size", "rope_theta",
             "compress_ratios", "n_routed_experts", "n_activated_experts", "moe_inter_dim"]


def parse_config(doc):
    """config.json document (dict) -> flat dict with the inference/config.json names."""
    if "text_config" in doc or "hidden_size" in doc:
        tc = doc.get("text_config", doc)
        cfg = {}
        for k, v in tc.items():
            if k in _HF_TO_FLAT:
                cfg[_HF_TO_FLAT[k]] = v
        rs = tc.get("rope_scaling") or {}
        if rs.get("rope_type", rs.get("type")) == "yarn":
            cfg["rope_factor"] = rs.get("factor", 1.0)
            cfg["original_seq_len"] = rs.get("original_max_position_embeddings", 0)
            cfg["beta_fast"] = rs.get("beta_fast", 32)
            cfg["beta_slow"] = rs.get("beta_slow", 1)
        else:
            cfg["original_seq_len"] = 0
        qc = doc.get("quantization_config") or tc.get("quantization_config") or {}
        cfg["weight_block_size"] = qc.get("weight_block_size", [32, 32])
        cfg["spelling"] = "hf"
    else:
        cfg = dict(doc)
        cfg["weight_block_size"] = [32, 32]
        cfg["spelling"] = "flat"
    for k, v in _DEFAULTS.items():
        cfg.setdefault(k, v)
    cfg.setdefault("compress_rope_theta", cfg.get("rope_theta"))
    for k in _REQUIRED:
        if k not in cfg:
            raise CheckpointError("config.json: missing field %r" % k)
    if list(cfg["weight_block_size"]) != [32, 32]:
        raise CheckpointError("config.json: weight_block_size %r, expected [32, 32]" % (cfg["weight_block_size"],))
    n_all = cfg["n_layers"] + cfg["n_mtp_layers"]
    if len(cfg["compress_ratios"]) != n_all:
        raise CheckpointError("config.json: compress_ratios has %d entries, expected n_layers + n_mtp = %d"
                              % (len(cfg["compress_ratios"]), n_all))
    return cfg


def load_config(path):
    p = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(p) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError("%s: %s" % (p, e))
    return parse_config(doc)


# ---- layer plan (spec section 2) ------------------------------------------------------------

class LayerPlan:
    pass


def layer_plan(cfg):
    """One LayerPlan per backbone layer then per DSpark stage, derived from the fields only:
    a layer with r > 0 reads the compressed KV of the latest KV source at or before it and the
    top-k of the latest index source at or before it; an index source that is not a KV source
    scores the index K of the latest KV source at or before it."""
    n, kvs, ixs = cfg["n_layers"], cfg["kv_source_layers"], cfg["index_source_layers"]
    cand = cfg["candidate_source_layer"]
    plans = []
    for l in range(n + cfg["n_mtp_layers"]):
        p = LayerPlan()
        p.id = l
        p.ratio = cfg["compress_ratios"][l]
        p.draft = l >= n
        p.is_kv_source = (not p.draft) and l in kvs
        p.is_index_source = (not p.draft) and l in ixs
        p.is_candidate_source = (not p.draft) and l == cand
        p.uses_candidates = p.is_index_source and 0 <= cand < l
        before_kv = [s for s in kvs if s <= l]
        before_ix = [s for s in ixs if s <= l]
        if p.ratio > 0 and not p.draft:
            if not before_kv or not before_ix:
                raise CheckpointError("layer %d: compress ratio %d but no KV/index source at or before it" % (l, p.ratio))
            p.kv_source = before_kv[-1]
            p.topk_source = before_ix[-1]
            if cfg["compress_ratios"][p.kv_source] != p.ratio or cfg["compress_ratios"][p.topk_source] != p.ratio:
                raise CheckpointError("layer %d: ratio differs from its KV / top-k source" % l)
            p.index_k_source = p.kv_source if p.is_index_source else -1
        else:
            p.kv_source = p.topk_source = p.index_k_source = -1
        p.engram_slot = cfg["engram_layer_ids"].index(l) if (not p.draft and l in cfg["engram_layer_ids"]) else -1
        p.is_dspark_target = (not p.draft) and l in cfg["dspark_target_layer_ids"]
        if p.ratio > 0:
            p.rope_theta, p.yarn = cfg["compress_rope_theta"], cfg["original_seq_len"] > 0
        else:
            p.rope_theta, p.yarn = cfg["rope_theta"], False
        if p.draft:
            p.n_experts = cfg["dspark_n_routed_experts"] or cfg["n_routed_experts"]
            p.n_active = cfg["dspark_n_activated_experts"] or cfg["n_activated_experts"]
        else:
            p.n_experts, p.n_active = cfg["n_routed_experts"], cfg["n_activated_experts"]
        p.prefix = ("mtp.%d." % (l - n)) if p.draft else ("layers.%d." % l)
        plans.append(p)
    return plans


# ---- safetensors ----------------------------------------------------------------------------

_DT = {"BF16": (np.uint16, 2), "F32": (np.float32, 4), "F16": (np.float16, 2),
       "F8_E4M3": (np.uint8, 1), "F8_E8M0": (np.uint8, 1), "I8": (np.uint8, 1), "U8": (np.uint8, 1),
       "I32": (np.int32, 4), "I64": (np.int64, 8)}


class RawTensor:
    def __init__(self, name, dtype, shape, data):
        self.name, self.dtype, self.shape, self.data = name, dtype, tuple(shape), data


def _open_safetensors(path, out):
    try:
        mm = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise CheckpointError("%s: %s" % (path, e))
    if mm.size < 8:
        raise CheckpointError("%s: too short for a safetensors header" % path)
    (n,) = struct.unpack("<Q", bytes(mm[:8]))
    if n > mm.size - 8:
        raise CheckpointError("%s: header length %d past the end of the file" % (path, n))
    try:
        header = json.loads(bytes(mm[8:8 + n]).decode("utf-8"))
    except ValueError as e:
        raise CheckpointError("%s: bad header JSON: %s" % (path, e))
    base = 8 + n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info.get("dtype")
        if dt not in _DT:
            raise CheckpointError("%s: tensor %s has unsupported dtype %r" % (path, name, dt))
        npdt, size = _DT[dt]
        shape = info["shape"]
        b, e = info["data_offsets"]
        count = int(np.prod(shape)) if shape else 1
        if e - b != count * size or base + e > mm.size:
            raise CheckpointError("%s: tensor %s: data_offsets [%d, %d] do not match shape %r x %d B"
                                  % (path, name, b, e, shape, size))
        data = mm[base + b:base + e].view(npdt).reshape(shape)
        out[name] = RawTensor(name, dt, shape, data)


def open_tensors(ckpt_dir):
    out = {}
    index = os.path.join(ckpt_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            wm = json.load(f)["weight_map"]
        for shard in sorted(set(wm.values())):
            _open_safetensors(os.path.join(ckpt_dir, shard), out)
    else:
        files = sorted(f for f in os.listdir(ckpt_dir) if f.endswith(".safetensors"))
        if not files:
            raise CheckpointError("%s: no .safetensors file and no model.safetensors.index.json" % ckpt_dir)
        for f in files:
            _open_safetensors(os.path.join(ckpt_dir, f), out)
    return out


class Checkpoint:
    """Tensors by name, converted on request into the values the reference computes with."""

    def __init__(self, ckpt_dir):
        self.dir = ckpt_dir
        self.cfg = load_config(ckpt_dir)
        self.plan = layer_plan(self.cfg)
        self.raw = open_tensors(ckpt_dir)

    def has(self, name):
        return name in self.raw

    def get(self, name):
        if name not in self.raw:
            raise CheckpointError("%s: missing tensor %s" % (self.dir, name))
        return self.raw[name]

    def values(self, name, shape=None):
        """FP32 values of a BF16 / F32 tensor (an FP8 tensor with a .scale sibling is dequantized)."""
        t = self.get(name)
        if t.dtype == "BF16":
            v = bf16_from_bits(np.asarray(t.data))
        elif t.dtype == "F32":
            v = np.array(t.data, dtype=F32)
        elif t.dtype == "F8_E4M3":
            v = self._fp8_dense(name)
        else:
            raise CheckpointError("%s: tensor %s has dtype %s, expected BF16/F32" % (self.dir, name, t.dtype))
        if shape is not None and tuple(v.shape) != tuple(shape):
            raise CheckpointError("%s: tensor %s has shape %r, expected %r" % (self.dir, name, v.shape, tuple(shape)))
        return v

    def _fp8_dense(self, name):
        w = self.get(name)
        s = self.get(name[:-len("weight")] + "scale")
        N, K = w.shape
        sc = ue8m0_decode(np.asarray(s.data)).astype(F64)
        rows = np.repeat(np.repeat(sc, 32, axis=0)[:N], 32, axis=1)[:, :K]
        return (E4M3_TABLE64[np.asarray(w.data)] * rows).astype(F32)

    def linear(self, stem, n_out, n_in):
        """The weight of linear `stem` ([n_out, n_in]) in the form its dtype implies:
        F8_E4M3 + 32x32 UE8M0 tiles -> FP8 linear; I8/U8 packed E2M1 + per-32 UE8M0 -> FP4 linear;
        BF16 / F32 -> plain weight."""
        w = self.get(stem + ".weight")
        if w.dtype == "F8_E4M3":
            s = self.get(stem + ".scale")
            exp_shape = ((n_out + 31) // 32, (n_in + 31) // 32)
            if tuple(w.shape) != (n_out, n_in) or tuple(s.shape) != exp_shape:
                raise CheckpointError("%s: %s: shape %r / scale %r, expected %r / %r"
                                      % (self.dir, stem, w.shape, s.shape, (n_out, n_in), exp_shape))
            codes, scales = w.data, np.asarray(s.data)

            def decode_fp8(b):
                sw = ue8m0_decode(scales[:, b]).astype(F64)
                sw = np.repeat(sw, 32)[:n_out]
                return E4M3_TABLE64[np.asarray(codes[:, 32 * b:32 * b + 32])] * sw[:, None]
            return BlockWeight(n_out, n_in, decode_fp8)
        if w.dtype in ("I8", "U8"):
            s = self.get(stem + ".scale")
            if tuple(w.shape) != (n_out, n_in // 2) or tuple(s.shape) != (n_out, n_in // 32):
                raise CheckpointError("%s: %s: shape %r / scale %r, expected %r / %r"
                                      % (self.dir, stem, w.shape, s.shape, (n_out, n_in // 2), (n_out, n_in // 32)))
            packed, scales = w.data, np.asarray(s.data)

            def decode_fp4(b):
                p = np.asarray(packed[:, 16 * b:16 * b + 16])
                codes = np.empty((n_out, 32), dtype=np.uint8)
                codes[:, 0::2] = p & 15
                codes[:, 1::2] = p >> 4
                return E2M1_TABLE64[codes] * ue8m0_decode(scales[:, b]).astype(F64)[:, None]
            return BlockWeight(n_out, n_in, decode_fp4)
        return self.plain(stem + ".weight", (n_out, n_in))

    def plain(self, name, shape):
        t = self.get(name)
        if t.dtype not in ("BF16", "F32") or tuple(t.shape) != tuple(shape):
            raise CheckpointError("%s: tensor %s is %s %r, expected BF16/F32 %r"
                                  % (self.dir, name, t.dtype, t.shape, tuple(shape)))
        return PlainWeight(shape[0], shape[1], lambda a, b: self.rows(name, a, b))

    def rows(self, name, a, b):
        """FP32 values of rows a..b-1 of a BF16 / F32 matrix (or of rows given as an index array
        when b is None)."""
        t = self.get(name)
        r = np.asarray(t.data[a:b] if b is not None else t.data[a])
        return bf16_from_bits(r) if t.dtype == "BF16" else r.astype(F32)

    def engram_token_map(self):
        p = os.path.join(self.dir, "engram_token_map.i32")
        if not os.path.exists(p):
            raise CheckpointError("%s: Engram layers need engram_token_map.i32 (no tokenizer-derived map "
                                  "is built by the reference)" % self.dir)
        m = np.fromfile(p, dtype="<i4")
        if m.size != self.cfg["vocab_size"]:
            raise CheckpointError("%s: %d entries, expected vocab_size %d" % (p, m.size, self.cfg["vocab_size"]))
        if m.min() < 0 or m.max() >= self.cfg["engram_compressed_vocab_size"]:
            raise CheckpointError("%s: ids outside [0, engram_compressed_vocab_size)" % p)
        return m.astype(np.int64)
