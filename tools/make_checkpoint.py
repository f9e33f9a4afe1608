#!/usr/bin/env -S /usr/bin/python3
"""Write a random DeepSeek V4.1 checkpoint directory for any config (spec section 8).

usage: make_checkpoint.py CONFIG_DIR_OR_JSON OUT_DIR [--seed N] [--shards K] [--token-map stub]
                          [--vision]

Writes OUT_DIR/config.json (a byte copy of the input config) and either
OUT_DIR/model.safetensors or, with --shards K > 1, OUT_DIR/model-0000i-of-0000K.safetensors
plus OUT_DIR/model.safetensors.index.json. Tensor names, dtypes and shapes follow spec
section 8, derived here from the config fields alone (both the Hugging Face spelling with
text_config / quantization_config and the reference's flat inference/config.json spelling).
--token-map stub also writes OUT_DIR/engram_token_map.i32 (int32 LE, one per vocabulary id)
with the stub map of spec section 9: ids 2k and 2k+1 -> k.
--vision also writes the vision tower and aligner the config describes (vision_config, or the
flat vision_* fields; docs/vision.md), all BF16: linears N(0, 1 / in), biases 0.02 N(0, 1),
norm weights 1 + 0.1 N(0, 1), image_start / end / newline of the embedding's RMS.

Streaming: every shape is known up front, so each shard's header is written first and then
each tensor's bytes are generated and written in chunks of at most CHUNK elements; the
checkpoint is never held in memory (peak RSS stays well under 200 MB at production width).

Layout: safetensors allows no holes between tensors, so to keep data offsets 8-byte aligned
every shard stores first the tensors whose byte size is a multiple of 8 (in spec order) and
then the few that are not (the F32 [3] hc_*_scale tensors, 12 bytes each), which are still
aligned to their element size. The header is padded with spaces to a multiple of 8 bytes.

Values (seeded: tensor t draws from its own generator seeded by (seed, sha256(name)), so its
bytes do not depend on sharding or tensor order; NumPy PCG64, reproducible for a given NumPy):
  * FP8 linears (E4M3 + UE8M0 32x32 tiles): codes drawn from a discretised Gaussian of RMS
    32 (code magnitudes up to ~448 never clip in practice), tile exponents
    round(log2(gain / sqrt(in) / 32 / 1.25)) + j with j in {-1, 0, 0, +1}, so the tile
    scales vary (1.25 = sqrt(E[4^j]) keeps the RMS at gain / sqrt(in)): unit-variance
    inputs give roughly unit-variance outputs.
  * FP4 experts (I8 packed E2M1 + UE8M0 per 32 inputs): uniform random bytes (both nibbles)
    and per-group exponents round(log2(gain / sqrt(in) / 2.93)) + j (2.93 = RMS of a uniform
    E2M1 code).
  * Engram tables: E4M3 codes as above, UE8M0 per 32 dims, rows of RMS ~1.
  * BF16 matrices N(0, (gain / sqrt(in))^2); embed RMS 0.12 and head 1 / sqrt(dim);
    norm weights mean * (1 + 0.1 N(0, 1)); attn_sink 0.5 N(0, 1) FP32; router
    bias / bias_vl 0.05 N(0, 1) FP32; hc fn N(0, 1) * 0.5 / sqrt(in), hc base: pre and post
    parts 0.5 N(0, 1), comb part identity + 0.3 N(0, 1) (each copy mostly keeps itself),
    hc scale 0.3 * (1 + 0.1 N(0, 1)).
  The norm means, projection gains and the embedding RMS are the statistics of the released
  checkpoint as recorded by the official reference's tiny-model builder (spec 9, S2);
  with all norm weights at 1 the MoE output swamps the residual of a random stack.
"""
import argparse
import hashlib
import json
import math
import os
import re
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import format_vectors as fv  # noqa: E402  (independent E4M3 / BF16 encoders, used for LUTs only)

CHUNK = 1 << 22          # elements generated per write
ELEM = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "I32": 4}

# released-checkpoint statistics (see the module docstring)
NORM_MEAN = {"attn_norm": 0.025, "ffn_norm": 0.2, "q_norm": 0.97, "kv_norm": 0.4,
             "compressor.norm": 0.6, "k_norm": 0.5}
GAIN = {"wq_a": 1.6, "wq_b": 0.95, "wkv": 1.8, "wo_a": 1.6, "wo_b": 1.9, "w1": 1.5, "w3": 1.5, "w2": 1.05}
EMBED_RMS = 0.12


# ------------------------------------------------------------------ config

HF_TO_FLAT = {
    "hidden_size": "dim", "num_hidden_layers": "n_layers", "num_nextn_predict_layers": "n_mtp_layers",
    "num_attention_heads": "n_heads", "qk_rope_head_dim": "rope_head_dim", "sliding_window": "window_size",
    "kv_source_layer_ids": "kv_source_layers", "index_source_layer_ids": "index_source_layers",
    "candidate_source_layer_id": "candidate_source_layer", "num_experts_per_tok": "n_activated_experts",
    "moe_intermediate_size": "moe_inter_dim", "dspark_num_experts_per_tok": "dspark_n_activated_experts",
    "engram_pad_token_id": "engram_pad_id", "rms_norm_eps": "norm_eps",
}


VISION_HF = {"num_hidden_layers": "vision_n_layers", "hidden_size": "vision_dim",
             "num_attention_heads": "vision_n_heads", "intermediate_size": "vision_inter_dim",
             "patch_size": "vision_patch_size", "downsample_ratio": "vision_downsample_ratio"}


class ConfigError(Exception):
    pass


def load_config(path):
    """Returns (raw bytes of config.json, dict in the flat spelling)."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        j = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"{path}: invalid JSON: {e}")
    if not isinstance(j, dict):
        raise ConfigError(f"{path}: top level is not an object")
    if "text_config" in j:
        flat = {}
        for k, v in j["text_config"].items():
            flat[HF_TO_FLAT.get(k, k)] = v
        q = j.get("quantization_config") or {}
        flat["weight_block_size"] = q.get("weight_block_size", [32, 32])
        flat["expert_dtype"] = q.get("expert_dtype", "fp4")
        flat["_vision"] = "vision_config" in j
        for k, v in (j.get("vision_config") or {}).items():
            if k in VISION_HF:
                flat[VISION_HF[k]] = v
    else:
        flat = dict(j)
        flat.setdefault("weight_block_size", [32, 32])
        flat["_vision"] = bool(flat.get("vision_n_layers"))
    return raw, flat


def need(c, key):
    if key not in c:
        raise ConfigError(f"config: missing field {key}")
    return c[key]


def next_prime(n):
    """Smallest prime > n."""
    def is_prime(m):
        if m < 2:
            return False
        if m % 2 == 0:
            return m == 2
        r = int(math.isqrt(m))
        for d in range(3, r + 1, 2):
            if m % d == 0:
                return False
        return True
    n += 1
    while not is_prime(n):
        n += 1
    return n


def engram_row_counts(c):
    """Spec 1.7: per Engram layer, order and head, the smallest prime greater than the previous
    value, the walk restarting at engram_vocab_size - 1 for every (layer, order), all distinct;
    a layer's row count is the sum of its primes."""
    used, rows = set(), []
    for _ in c["engram_layer_ids"]:
        total = 0
        for _order in range(2, c["engram_max_ngram_size"] + 1):
            p = c["engram_vocab_size"] - 1
            for _head in range(c["engram_n_heads"]):
                p = next_prime(p)
                while p in used:
                    p = next_prime(p)
                used.add(p)
                total += p
        rows.append(total)
    return rows


# ------------------------------------------------------------------ tensor list (spec 8)

class T:
    """One tensor: name, dtype, shape, and how to fill it (kind, params)."""
    __slots__ = ("name", "dtype", "shape", "kind", "p")

    def __init__(self, name, dtype, shape, kind, **p):
        self.name, self.dtype, self.shape, self.kind, self.p = name, dtype, [int(s) for s in shape], kind, p

    @property
    def nbytes(self):
        n = ELEM[self.dtype]
        for s in self.shape:
            n *= s
        return n


def cdiv(a, b):
    return -(-a // b)


def vision_tensors(c, out):
    """The vision tower and aligner (docs/vision.md), names as the official vision.py's modules."""
    if not c.get("_vision") or not c.get("vision_n_layers"):
        raise ConfigError("config: --vision needs a vision tower in the config (vision_config / vision_n_layers)")
    D, H, I = need(c, "vision_dim"), need(c, "vision_n_heads"), need(c, "vision_inter_dim")
    p, r, L, dim = need(c, "vision_patch_size"), need(c, "vision_downsample_ratio"), c["vision_n_layers"], c["dim"]
    if D % H or (D // H) % 4:
        raise ConfigError(f"config: vision head dim {D}/{H} is not a multiple of 4 (2D rotary halves)")

    def lin(name, o, i, bias=True):
        out.append(T(name + ".weight", "BF16", [o, i], "bf16", sigma=1.0 / math.sqrt(i)))
        if bias:
            out.append(T(name + ".bias", "BF16", [o], "bf16", sigma=0.02))

    lin("vision.patch_embed.proj", D, 3 * p * p)
    for b in range(L):
        pre = f"vision.blocks.{b}."
        out.append(T(pre + "norm1.weight", "BF16", [D], "norm", mean=1.0))
        lin(pre + "attn.wqkv", 3 * D, D)
        lin(pre + "attn.wo", D, D)
        out.append(T(pre + "norm2.weight", "BF16", [D], "norm", mean=1.0))
        lin(pre + "mlp.w1", 2 * I, D, bias=False)
        lin(pre + "mlp.w2", D, I, bias=False)
    out.append(T("vision.norm.weight", "BF16", [D], "norm", mean=1.0))
    lin("aligner.w1", dim, D * r * r)
    lin("aligner.w2", dim, dim)
    for n in ("image_start", "image_end", "image_newline"):
        out.append(T(n, "BF16", [dim], "bf16", sigma=EMBED_RMS))


def tensor_list(c, vision=False):
    """Every tensor of spec section 8 for config c (flat spelling), in spec order; with vision,
    the vision tower's after them."""
    for key in ("vocab_size", "dim", "n_layers", "n_heads", "head_dim", "q_lora_rank", "o_groups",
                "o_lora_rank", "compress_ratios", "n_routed_experts", "moe_inter_dim"):
        need(c, key)
    dim, vocab, L = c["dim"], c["vocab_size"], c["n_layers"]
    n_mtp = c.get("n_mtp_layers", 0)
    H, hd, ql = c["n_heads"], c["head_dim"], c["q_lora_rank"]
    og, ol = c["o_groups"], c["o_lora_rank"]
    hc = c.get("hc_mult", 4)
    mix = (2 + hc) * hc
    inter = c["moe_inter_dim"]
    n_shared = c.get("n_shared_experts", 0)
    ratios = c["compress_ratios"]
    kv_src = list(c.get("kv_source_layers", []))
    idx_src = list(c.get("index_source_layers", []))
    eng_layers = list(c.get("engram_layer_ids", []))
    blk = c["weight_block_size"]
    if list(blk) != [32, 32]:
        raise ConfigError(f"config: weight_block_size {blk} (only [32, 32] is the V4.1 format)")
    if len(ratios) != L + n_mtp:
        raise ConfigError(f"config: compress_ratios has {len(ratios)} entries, expected n_layers + n_mtp = {L + n_mtp}")
    if (H * hd) % og:
        raise ConfigError(f"config: n_heads * head_dim = {H * hd} not divisible by o_groups {og}")
    for name, v in (("dim", dim), ("moe_inter_dim", inter)):
        if v % 32:
            raise ConfigError(f"config: {name} = {v} is not a multiple of 32 (FP4 expert groups)")
    out = []

    def fp8(name, o, i, gain=1.0):
        out.append(T(name + ".weight", "F8_E4M3", [o, i], "fp8w", sigma=gain / math.sqrt(i)))
        out.append(T(name + ".scale", "F8_E8M0", [cdiv(o, 32), cdiv(i, 32)], "fp8s", sigma=gain / math.sqrt(i)))

    def fp4(name, o, i, gain=1.0):
        out.append(T(name + ".weight", "I8", [o, i // 2], "fp4w"))
        out.append(T(name + ".scale", "F8_E8M0", [o, i // 32], "fp4s", sigma=gain / math.sqrt(i)))

    def bf16(name, shape, sigma):
        out.append(T(name, "BF16", shape, "bf16", sigma=sigma))

    def norm(name, n, mean=1.0):
        out.append(T(name, "BF16", [n], "norm", mean=mean))

    def f32(name, shape, kind, **p):
        out.append(T(name, "F32", shape, kind, **p))

    out.append(T("embed.weight", "BF16", [vocab, dim], "bf16", sigma=EMBED_RMS))
    if not c.get("tie_word_embeddings", False):
        bf16("head.weight", [vocab, dim], 1.0 / math.sqrt(dim))
    norm("norm.weight", dim)

    eng_rows = c.get("engram_num_embeddings") or engram_row_counts(c) if eng_layers else []
    if eng_layers and len(eng_rows) != len(eng_layers):
        raise ConfigError(f"config: engram_num_embeddings has {len(eng_rows)} entries for {len(eng_layers)} Engram layers")

    for li in range(L + n_mtp):
        draft = li >= L
        pre = f"mtp.{li - L}." if draft else f"layers.{li}."
        E = c.get("dspark_n_routed_experts", c["n_routed_experts"]) if draft else c["n_routed_experts"]
        f32(pre + "attn.attn_sink", [H], "gauss32", sigma=0.5)
        norm(pre + "attn.q_norm.weight", ql, NORM_MEAN["q_norm"])
        norm(pre + "attn.kv_norm.weight", hd, NORM_MEAN["kv_norm"])
        fp8(pre + "attn.wq_a", ql, dim, GAIN["wq_a"])
        fp8(pre + "attn.wq_b", H * hd, ql, GAIN["wq_b"])
        fp8(pre + "attn.wkv", hd, dim, GAIN["wkv"])
        fp8(pre + "attn.wo_a", og * ol, H * hd // og, GAIN["wo_a"])
        fp8(pre + "attn.wo_b", dim, og * ol, GAIN["wo_b"])
        norm(pre + "attn_norm.weight", dim, NORM_MEAN["attn_norm"])
        norm(pre + "ffn_norm.weight", dim, NORM_MEAN["ffn_norm"])
        for sub in ("attn", "ffn"):
            f32(pre + f"hc_{sub}_fn", [mix, hc * dim], "gauss32", sigma=0.5 / math.sqrt(hc * dim))
            f32(pre + f"hc_{sub}_base", [mix], "hc_base", hc=hc)
            f32(pre + f"hc_{sub}_scale", [3], "hc_scale")
        bf16(pre + "ffn.gate.weight", [E, dim], 1.0 / math.sqrt(dim))
        f32(pre + "ffn.gate.bias", [E], "gauss32", sigma=0.05)
        f32(pre + "ffn.gate.bias_vl", [E], "gauss32", sigma=0.05)
        for e in range(E):
            fp4(pre + f"ffn.experts.{e}.w1", inter, dim, GAIN["w1"])
            fp4(pre + f"ffn.experts.{e}.w2", dim, inter, GAIN["w2"])
            fp4(pre + f"ffn.experts.{e}.w3", inter, dim, GAIN["w3"])
        if n_shared:
            si = inter * n_shared
            fp8(pre + "ffn.shared_experts.w1", si, dim, GAIN["w1"])
            fp8(pre + "ffn.shared_experts.w2", dim, si, GAIN["w2"])
            fp8(pre + "ffn.shared_experts.w3", si, dim, GAIN["w3"])
        if not draft and li in kv_src:
            if ratios[li] <= 0:
                raise ConfigError(f"config: KV source layer {li} has compress ratio {ratios[li]}")
            norm(pre + "attn.compressor.norm.weight", hd, NORM_MEAN["compressor.norm"])
            bf16(pre + "attn.compressor.wkv.weight", [hd, dim], 1.0 / math.sqrt(dim))
            if ratios[li] > 1:
                bf16(pre + "attn.compressor.wgate.weight", [hd, dim], 1.0 / math.sqrt(dim))
            norm(pre + "attn.indexer.k_norm.weight", need(c, "index_head_dim"), NORM_MEAN["k_norm"])
            bf16(pre + "attn.indexer.wk.weight", [c["index_head_dim"], hd], 1.0 / math.sqrt(hd))
        if not draft and li in idx_src:
            ih, idim = need(c, "index_n_heads"), need(c, "index_head_dim")
            bf16(pre + "attn.indexer.weights_proj.weight", [ih, dim], 1.0 / math.sqrt(dim))
            fp8(pre + "attn.indexer.wq_b", ih * idim, ql)
        if not draft and li in eng_layers:
            slot = eng_layers.index(li)
            ehd, eh, en = need(c, "engram_head_dim"), need(c, "engram_n_heads"), need(c, "engram_max_ngram_size")
            if ehd % 32:
                raise ConfigError(f"config: engram_head_dim {ehd} is not a multiple of 32")
            rows = int(eng_rows[slot])
            out.append(T(pre + "engram.embed.weight", "F8_E4M3", [rows, ehd], "e4m3codes"))
            out.append(T(pre + "engram.embed.scale", "F8_E8M0", [rows, ehd // 32], "rowscale", sigma=1.0))
            out.append(T(pre + "engram.q_weight", "BF16", [hc, dim], "norm", mean=1.0))
            out.append(T(pre + "engram.k_weight", "BF16", [hc, dim], "norm", mean=1.0))
            fp8(pre + "engram.wkv", (hc + 1) * dim, (en - 1) * eh * ehd)
        if draft and li == L:
            targets = need(c, "dspark_target_layer_ids")
            fp8(pre + "main_proj", dim, len(targets) * dim)
            norm(pre + "main_norm.weight", dim)
        if draft and li == L + n_mtp - 1:
            rank = need(c, "dspark_markov_rank")
            norm(pre + "norm.weight", dim)
            bf16(pre + "markov_head.embed.weight", [vocab, rank], 1.0)
            bf16(pre + "markov_head.head.weight", [vocab, rank], 1.0 / math.sqrt(rank))
            bf16(pre + "confidence_head.proj.weight", [1, dim + rank], 1.0 / math.sqrt(dim + rank))
    if vision:
        vision_tensors(c, out)
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ConfigError("config: duplicate tensor names (overlapping layer lists?)")
    return out


# ------------------------------------------------------------------ value generation

_LUT_NORMAL = None


def normal_lut():
    """65536 sorted N(0, 1) samples (fixed seed): a discretised Gaussian indexed by random u16."""
    global _LUT_NORMAL
    if _LUT_NORMAL is None:
        _LUT_NORMAL = np.sort(np.random.default_rng(20260412).standard_normal(65536)).astype(np.float32)
    return _LUT_NORMAL


_LUT_E4M3 = None


def e4m3_lut():
    global _LUT_E4M3
    if _LUT_E4M3 is None:
        _LUT_E4M3 = fv.e4m3_encode((normal_lut() * np.float32(32.0)).astype(np.float32))
    return _LUT_E4M3


def bf16_bits(x32):
    return fv.bf16_encode(np.ascontiguousarray(x32, dtype=np.float32).view(np.uint32))


def tensor_rng(seed, name):
    h = hashlib.sha256(name.encode()).digest()
    words = list(struct.unpack("<4I", h[:16]))
    return np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32] + words))


def random_u16(rng, n):
    return np.frombuffer(rng.bytes(2 * n), dtype="<u2")


def scale_exponents(rng, n, sigma, unit_rms, jitter=True):
    """UE8M0 bytes: round(log2(sigma / unit_rms / 1.25)) + j, j in {-1, 0, 0, +1}."""
    base = int(round(math.log2(sigma / unit_rms / (1.25 if jitter else 1.0))))
    j = (np.frombuffer(rng.bytes(n), dtype=np.uint8) & 3).astype(np.int32) - 1
    j = np.where(j == 2, 0, j) if jitter else np.zeros(n, dtype=np.int32)
    e = np.clip(base + 127 + j, 1, 254)
    return e.astype(np.uint8)


def chunks(t, rng):
    """Yields the tensor's bytes as numpy arrays, at most CHUNK elements at a time."""
    n = 1
    for s in t.shape:
        n *= s
    k, p = t.kind, t.p
    done = 0
    while done < n:
        m = min(CHUNK, n - done)
        if k in ("fp8w", "e4m3codes"):
            a = e4m3_lut()[random_u16(rng, m)]
        elif k == "fp4w":
            a = np.frombuffer(rng.bytes(m), dtype=np.uint8)
        elif k == "fp8s":
            a = scale_exponents(rng, m, p["sigma"], 32.0)
        elif k == "fp4s":
            a = scale_exponents(rng, m, p["sigma"], 2.93)
        elif k == "rowscale":
            a = scale_exponents(rng, m, p["sigma"], 32.0)
        elif k == "bf16":
            lut = bf16_bits(normal_lut() * np.float32(p["sigma"]))
            a = lut[random_u16(rng, m)]
        elif k == "norm":
            x = np.float32(p["mean"]) * (np.float32(1) + np.float32(0.1) * rng.standard_normal(m, dtype=np.float32))
            a = bf16_bits(x)
        elif k == "gauss32":
            a = (rng.standard_normal(m, dtype=np.float32) * np.float32(p["sigma"])).astype("<f4")
        elif k == "hc_base":
            hc = p["hc"]
            a = (np.float32(0.5) * rng.standard_normal(m, dtype=np.float32)).astype("<f4")
            comb = np.eye(hc, dtype=np.float32).reshape(-1) + np.float32(0.3) * rng.standard_normal(hc * hc, dtype=np.float32)
            a[2 * hc:] = comb
        elif k == "hc_scale":
            a = (np.float32(0.3) * (np.float32(1) + np.float32(0.1) * rng.standard_normal(m, dtype=np.float32))).astype("<f4")
        else:
            raise AssertionError(k)
        if a.dtype.itemsize > 1:
            a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        yield a
        done += m


# ------------------------------------------------------------------ safetensors writing

def file_order(tensors):
    """Tensors whose size is a multiple of 8 first (8-aligned offsets, no holes), then the rest
    by decreasing element size (so each stays aligned to its element)."""
    even = [t for t in tensors if t.nbytes % 8 == 0]
    odd = sorted((t for t in tensors if t.nbytes % 8), key=lambda t: -ELEM[t.dtype])
    return even + odd


def header_bytes(ordered):
    meta = {"__metadata__": {"format": "pt"}}
    off = 0
    for t in ordered:
        meta[t.name] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    h = json.dumps(meta, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return h, off


def split_shards(tensors, k):
    """K non-empty shards of similar byte size: largest tensor first into the currently
    lightest shard (ties: lowest shard); each shard then keeps spec order. Deterministic."""
    if k < 1 or k > len(tensors):
        raise ConfigError(f"--shards {k}: must be between 1 and the tensor count {len(tensors)}")
    order = sorted(range(len(tensors)), key=lambda i: (-tensors[i].nbytes, i))
    load, members = [0] * k, [[] for _ in range(k)]
    for i in order:
        s = min(range(k), key=lambda j: (load[j], j))
        load[s] += tensors[i].nbytes
        members[s].append(i)
    return [[tensors[i] for i in sorted(m)] for m in members]


def write_shard(path, tensors, seed):
    ordered = file_order(tensors)
    h, data_len = header_bytes(ordered)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for t in ordered:
            rng = tensor_rng(seed, t.name)
            written = 0
            for a in chunks(t, rng):
                b = memoryview(np.ascontiguousarray(a)).cast("B")
                f.write(b)
                written += len(b)
            assert written == t.nbytes, (t.name, written, t.nbytes)
    return 8 + len(h) + data_len


def write_checkpoint(config_path, out_dir, seed=0, shards=1, token_map=None, log=None, vision=False):
    raw, c = load_config(config_path)
    tensors = tensor_list(c, vision)
    os.makedirs(out_dir, exist_ok=True)
    # remove what an earlier run with another shard count would leave behind
    for n in os.listdir(out_dir):
        if re.fullmatch(r"model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?", n):
            os.remove(os.path.join(out_dir, n))
    with open(os.path.join(out_dir, "config.json"), "wb") as f:
        f.write(raw)
    total = 0
    if shards == 1:
        total += write_shard(os.path.join(out_dir, "model.safetensors"), tensors, seed)
    else:
        weight_map = {}
        parts = split_shards(tensors, shards)
        for i, part in enumerate(parts):
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            total += write_shard(os.path.join(out_dir, fname), part, seed)
            for t in part:
                weight_map[t.name] = fname
        index = {"metadata": {"total_size": sum(t.nbytes for t in tensors)},
                 "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    if token_map == "stub":
        vocab = c["vocab_size"]
        cv = c.get("engram_compressed_vocab_size")
        if cv is not None and (vocab + 1) // 2 > cv:
            raise ConfigError(f"--token-map stub: maps to {(vocab + 1) // 2} ids but "
                              f"engram_compressed_vocab_size is {cv}")
        np.arange(vocab, dtype="<i4").__floordiv__(2).astype("<i4").tofile(
            os.path.join(out_dir, "engram_token_map.i32"))
    elif token_map is not None:
        raise ConfigError(f"--token-map {token_map}: only 'stub' is known")
    return tensors, total


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="checkpoint directory holding config.json, or a config.json file")
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--token-map", choices=["stub"], default=None)
    ap.add_argument("--vision", action="store_true", help="also write the vision tower and aligner")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.seed < 0 or a.seed >= 1 << 64:
        ap.error("--seed must be in [0, 2^64)")
    t0 = time.time()
    try:
        tensors, total = write_checkpoint(a.config, a.out_dir, a.seed, a.shards, a.token_map,
                                         vision=a.vision)
    except (ConfigError, OSError) as e:
        print(f"make_checkpoint: {e}", file=sys.stderr)
        return 1
    if not a.quiet:
        import resource
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"make_checkpoint: {a.out_dir}: {len(tensors)} tensors, {total} bytes in {a.shards} "
              f"file(s), {time.time() - t0:.1f} s, peak RSS {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
