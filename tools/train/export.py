#!/usr/bin/env python3
"""Writes the trained demo model in the release layout: OUT/model.safetensors with every tensor
of spec section 8 for the config (FP8 E4M3 with UE8M0 32x32 tiles, FP4 E2M1 experts with a UE8M0
scale per 32 inputs, E4M3 Engram rows with a UE8M0 scale per 32, BF16 and F32 where the release
has them), and OUT/released.pt: the torch state dict holding exactly the values the file decodes
to, so that the torch twin can be evaluated on the released weights (evaluate.py).

    python3 tools/train/export.py --state build/demo-train/state.pt --out models/demo

The quantizers are the NumPy bit-exact ones of tools/reference/formats.py (scales: the
power-of-two ceiling of amax / 448 for E4M3, amax / 6 for E2M1; codes round to nearest even)."""

import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import v41  # noqa: E402
from formats import (F32, bf16_round, bf16_to_bits, e4m3_encode, e4m3_decode, e2m1_encode, e2m1_decode,  # noqa: E402
                     e2m1_pack, pow2ceil, ue8m0_decode, INV448, INV6)
from make_checkpoint import tensor_list, load_config  # noqa: E402

TINY = F32(2.0 ** -100)


def ue8m0_byte(s):
    return ((np.ascontiguousarray(s, dtype=F32).view(np.uint32) >> 23) & 0xFF).astype(np.uint8)


def fp8_tiles(w):
    """[N, K] -> (codes [N, K] u8, scale bytes [ceil(N/32), ceil(K/32)], decoded [N, K] f32)."""
    N, K = w.shape
    nb, kb = -(-N // 32), -(-K // 32)
    wp = np.zeros((nb * 32, kb * 32), dtype=F32)
    wp[:N, :K] = w
    t = wp.reshape(nb, 32, kb, 32)
    a = np.maximum(np.abs(t).max(axis=(1, 3)), TINY)
    s = pow2ceil(a, INV448)                                              # [nb, kb]
    q = e4m3_encode(np.clip(t / s[:, None, :, None], F32(-448), F32(448)))
    dec = (e4m3_decode(q) * s[:, None, :, None]).astype(F32)
    return (q.reshape(nb * 32, kb * 32)[:N, :K].copy(), ue8m0_byte(s),
            dec.reshape(nb * 32, kb * 32)[:N, :K].copy())


def fp4_rows(w):
    """[N, K] -> (packed [N, K/2] u8, scale bytes [N, K/32], decoded)."""
    N, K = w.shape
    g = w.reshape(N, K // 32, 32)
    a = np.maximum(np.abs(g).max(axis=-1), TINY)
    s = pow2ceil(a, INV6)
    codes = e2m1_encode(np.clip(g / s[..., None], F32(-6), F32(6)))
    dec = (e2m1_decode(codes) * s[..., None]).reshape(N, K).astype(F32)
    return e2m1_pack(codes.reshape(N, K)), ue8m0_byte(s), dec


def e4m3_rows(w):
    """Engram table [rows, hd] -> (codes, scale bytes [rows, hd/32], decoded)."""
    R, D = w.shape
    g = w.reshape(R, D // 32, 32)
    a = np.maximum(np.abs(g).max(axis=-1), TINY)
    s = pow2ceil(a, INV448)
    q = e4m3_encode(np.clip(g / s[..., None], F32(-448), F32(448)))
    dec = (e4m3_decode(q) * s[..., None]).reshape(R, D).astype(F32)
    return q.reshape(R, D), ue8m0_byte(s), dec


def bf16(w):
    r = bf16_round(np.ascontiguousarray(w, dtype=F32))
    return bf16_to_bits(r).astype("<u2"), r.astype(F32)


def source_map(model):
    """release tensor base name -> (torch state-dict key, kind)."""
    cfg, L = model.cfg, model.nL
    m = {"embed.weight": ("embed", "bf16"), "head.weight": ("head.weight", "bf16"),
         "norm.weight": ("norm.weight", "bf16")}
    for p in model.plan:
        li = p.id
        pre = ("mtp.%d." % (li - L)) if p.draft else ("layers.%d." % li)
        b = "blocks.%d." % li
        m[pre + "attn.attn_sink"] = (b + "attn.sink", "f32")
        for n in ("q_norm", "kv_norm"):
            m[pre + "attn.%s.weight" % n] = (b + "attn.%s.weight" % n, "bf16")
        for n in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b"):
            m[pre + "attn." + n] = (b + "attn.%s.weight" % n, "fp8")
        m[pre + "attn_norm.weight"] = (b + "attn_norm.weight", "bf16")
        m[pre + "ffn_norm.weight"] = (b + "ffn_norm.weight", "bf16")
        for s in ("attn", "ffn"):
            m[pre + "hc_%s_fn" % s] = (b + "hc_%s.fn" % s, "f32")
            m[pre + "hc_%s_base" % s] = (b + "hc_%s.base" % s, "f32")
            m[pre + "hc_%s_scale" % s] = (b + "hc_%s.scale" % s, "f32")
        m[pre + "ffn.gate.weight"] = (b + "ffn.gate.weight", "bf16")
        m[pre + "ffn.gate.bias"] = (b + "ffn.bias", "f32")
        m[pre + "ffn.gate.bias_vl"] = (b + "ffn.bias", "f32")     # image spans: same bias (no vision)
        for e in range(p.n_experts):
            for w in ("w1", "w2", "w3"):
                m[pre + "ffn.experts.%d.%s" % (e, w)] = (b + "ffn.experts.%d.%s.weight" % (e, w), "fp4")
        for w in ("w1", "w2", "w3"):
            m[pre + "ffn.shared_experts.%s" % w] = (b + "ffn.shared.%s.weight" % w, "fp8")
        if p.is_kv_source:
            m[pre + "attn.compressor.norm.weight"] = (b + "attn.c_norm.weight", "bf16")
            m[pre + "attn.compressor.wkv.weight"] = (b + "attn.c_wkv.weight", "bf16")
            if p.ratio > 1:
                m[pre + "attn.compressor.wgate.weight"] = (b + "attn.c_wgate.weight", "bf16")
            m[pre + "attn.indexer.k_norm.weight"] = (b + "attn.ix_k_norm.weight", "bf16")
            m[pre + "attn.indexer.wk.weight"] = (b + "attn.ix_wk.weight", "bf16")
        if p.is_index_source:
            m[pre + "attn.indexer.weights_proj.weight"] = (b + "attn.ix_weights_proj.weight", "bf16")
            m[pre + "attn.indexer.wq_b"] = (b + "attn.ix_wq_b.weight", "fp8")
        if p.engram_slot >= 0:
            e = "engrams.%d." % li
            m[pre + "engram.embed"] = (e + "table", "e4m3rows")
            m[pre + "engram.q_weight"] = (e + "qk", "bf16")
            m[pre + "engram.k_weight"] = (None, "ones")
            m[pre + "engram.wkv"] = (e + "wkv.weight", "fp8")
        if p.draft and li == L:
            m[pre + "main_proj"] = ("main_proj.weight", "fp8")
            m[pre + "main_norm.weight"] = ("main_norm.weight", "bf16")
        if p.draft and li == len(model.plan) - 1:
            m[pre + "norm.weight"] = ("mtp_norm.weight", "bf16")
            m[pre + "markov_head.embed.weight"] = ("markov_embed", "bf16")
            m[pre + "markov_head.head.weight"] = ("markov_head.weight", "bf16")
            m[pre + "confidence_head.proj.weight"] = ("conf_proj.weight", "bf16")
    return m


def encode(base, kind, w):
    """One release tensor: w (FP32 numpy) in its format -> ({file name: (dtype, shape, data)},
    the values the file decodes to)."""
    if kind == "bf16":
        bits, dec = bf16(w)
        return {base: ("BF16", w.shape, bits)}, dec
    if kind == "f32":
        return {base: ("F32", w.shape, w.astype("<f4"))}, w
    if kind == "fp8":
        q, s, dec = fp8_tiles(w)
        return {base + ".weight": ("F8_E4M3", w.shape, q), base + ".scale": ("F8_E8M0", s.shape, s)}, dec
    if kind == "fp4":
        q, s, dec = fp4_rows(w)
        return {base + ".weight": ("I8", q.shape, q), base + ".scale": ("F8_E8M0", s.shape, s)}, dec
    if kind == "e4m3rows":
        q, s, dec = e4m3_rows(w)
        return {base + ".weight": ("F8_E4M3", w.shape, q), base + ".scale": ("F8_E8M0", s.shape, s)}, dec
    raise ValueError(kind)


def file_names(base, kind):
    """The safetensors names a release tensor occupies."""
    return [base + ".weight", base + ".scale"] if kind in ("fp8", "fp4", "e4m3rows") else [base]


def build(model, sd):
    """-> (list of (name, dtype, shape, bytes)), released state dict."""
    m = source_map(model)
    out, rel = {}, {}
    for base, (key, kind) in m.items():
        if kind == "ones":
            shape = tuple(sd[m[base.replace("k_weight", "q_weight")][0]].shape)
            bits, _ = bf16(np.ones(shape, dtype=F32))
            out[base] = ("BF16", shape, bits)
            continue
        w = sd[key].detach().float().numpy().astype(F32)
        files, dec = encode(base, kind, w)
        out.update(files)
        if key in rel and not np.array_equal(rel[key], dec):
            raise ValueError("two release tensors decode %s differently" % key)
        rel[key] = dec
    return out, rel


def load_release(model, ckpt_dir):
    """The torch state dict that a release checkpoint decodes to (the inverse of build(): FP8
    tiles, FP4 rows and E4M3 Engram rows dequantized, BF16 widened, F32 as is); Engram
    q_weight * k_weight becomes qk. Used to evaluate the twin on the committed files."""
    from checkpoint import open_tensors
    raw = open_tensors(ckpt_dir)
    sd = {k: v.clone() for k, v in model.state_dict().items()}

    def arr(name):
        return np.asarray(raw[name].data)

    def bf(name):
        return (arr(name).astype(np.uint32) << 16).view(F32)
    for base, (key, kind) in source_map(model).items():
        if kind == "ones":
            continue
        if kind == "bf16":
            v = bf(base)
        elif kind == "f32":
            v = arr(base).astype(F32)
        elif kind == "fp8":
            q, sc = arr(base + ".weight"), arr(base + ".scale")
            N, K = q.shape
            s = ue8m0_decode(sc)
            v = e4m3_decode(q) * np.repeat(np.repeat(s, 32, axis=0), 32, axis=1)[:N, :K]
        elif kind == "fp4":
            packed, sc = arr(base + ".weight"), arr(base + ".scale")
            codes = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
            codes[:, 0::2], codes[:, 1::2] = packed & 15, packed >> 4
            v = e2m1_decode(codes) * np.repeat(ue8m0_decode(sc), 32, axis=1)
        elif kind == "e4m3rows":
            q, sc = arr(base + ".weight"), arr(base + ".scale")
            v = e4m3_decode(q) * np.repeat(ue8m0_decode(sc), 32, axis=1)
        if kind == "bf16" and key.endswith(".qk"):
            v = v * bf(base.replace("q_weight", "k_weight"))
        sd[key] = torch.from_numpy(np.ascontiguousarray(v, dtype=F32)).reshape(sd[key].shape)
    return sd


def write_safetensors(path, tensors, expected):
    """tensors: name -> (dtype, shape, array); checked against the contract (name, dtype, shape)."""
    exp = {t.name: (t.dtype, tuple(t.shape)) for t in expected}
    got = {n: (d, tuple(int(x) for x in s)) for n, (d, s, _) in tensors.items()}
    if exp != got:
        miss = sorted(set(exp) - set(got))[:5]
        extra = sorted(set(got) - set(exp))[:5]
        bad = sorted(n for n in set(exp) & set(got) if exp[n] != got[n])[:5]
        raise SystemExit("export: tensors differ from the contract: missing %s, unexpected %s, misshaped %s"
                         % (miss, extra, [(n, exp[n], got[n]) for n in bad]))
    size = {"F32": 4, "BF16": 2}
    names = sorted(tensors, key=lambda n: (-size.get(tensors[n][0], 1), n))
    meta, off, blobs = {}, 0, []
    for n in names:
        dt, shape, arr = tensors[n]
        b = np.ascontiguousarray(arr).tobytes()
        meta[n] = {"dtype": dt, "shape": [int(x) for x in shape], "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    meta["__metadata__"] = {"format": "pt", "producer": "ds41 tools/train/export.py"}
    hdr = json.dumps(meta, separators=(",", ":")).encode()
    hdr += b" " * (-len(hdr) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(hdr).to_bytes(8, "little"))
        f.write(hdr)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    return 8 + len(hdr) + off


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", default="build/demo-train/state.pt")
    ap.add_argument("--out", default="models/demo")
    ap.add_argument("--released", default="build/demo-train/released.pt")
    args = ap.parse_args()
    with open(os.path.join(args.out, "config.json")) as f:
        doc = json.load(f)
    model = v41.V41(doc)
    st = torch.load(args.state)
    sd = st["model"] if "model" in st else st
    model.load_state_dict(sd)
    tensors, rel = build(model, model.state_dict())
    _, flat = load_config(os.path.join(args.out, "config.json"))
    n = write_safetensors(os.path.join(args.out, "model.safetensors"), tensors, tensor_list(flat))
    full = {k: v.clone() for k, v in model.state_dict().items()}
    for k, v in rel.items():
        full[k] = torch.from_numpy(np.ascontiguousarray(v)).reshape(full[k].shape)
    # Engram: the release stores q_weight = bf16(qk) and k_weight = 1, so qk = q_weight exactly
    torch.save(full, args.released)
    print("wrote %s/model.safetensors (%d tensors, %d bytes) and %s" % (args.out, len(tensors), n, args.released))


if __name__ == "__main__":
    main()
