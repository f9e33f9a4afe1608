#!/usr/bin/env python3
"""Adds the trained vision tower (vision_train.py) to models/demo: the tower, aligner and image
vectors as BF16 tensors under the official names (docs/vision.md), the vision_config and
image_token_id in config.json. Every text tensor keeps its bytes (read from the committed file
and written back unchanged; ffn.gate.bias_vl is already there, equal to ffn.gate.bias); the
whole set is checked against make_checkpoint.tensor_list with the tower, and written by
export.write_safetensors.

    python3 tools/train/vision_export.py --state build/demo-vision/vision_state.pt --out models/demo"""

import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from export import bf16, write_safetensors  # noqa: E402
from make_checkpoint import tensor_list, load_config  # noqa: E402
import vision_data  # noqa: E402


def tower_names(n_layers):
    """vision_train.Tower state-dict key -> release name."""
    m = {"patch.weight": "vision.patch_embed.proj.weight", "patch.bias": "vision.patch_embed.proj.bias",
         "norm.weight": "vision.norm.weight", "al1.weight": "aligner.w1.weight", "al1.bias": "aligner.w1.bias",
         "al2.weight": "aligner.w2.weight", "al2.bias": "aligner.w2.bias",
         "image_start": "image_start", "image_end": "image_end", "image_newline": "image_newline"}
    for b in range(n_layers):
        s, d = "blocks.%d." % b, "vision.blocks.%d." % b
        m.update({s + "norm1.weight": d + "norm1.weight", s + "norm2.weight": d + "norm2.weight",
                  s + "wqkv.weight": d + "attn.wqkv.weight", s + "wqkv.bias": d + "attn.wqkv.bias",
                  s + "wo.weight": d + "attn.wo.weight", s + "wo.bias": d + "attn.wo.bias",
                  s + "w1.weight": d + "mlp.w1.weight", s + "w2.weight": d + "mlp.w2.weight"})
    return m


def read_raw(path):
    """name -> (dtype, shape, raw bytes as uint8) of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    body = np.frombuffer(raw, dtype=np.uint8, offset=8 + n)
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], tuple(t["shape"]), body[a:b])
    return out


def vision_config(vc):
    side = vision_data.SIZE
    return dict({"model_type": "deepseek_v41_vision"}, **vc, max_image_tokens=1024,
                min_pixels=side * side)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", default="build/demo-vision/vision_state.pt")
    ap.add_argument("--out", default="models/demo")
    a = ap.parse_args()
    st = torch.load(a.state)
    vc = st["vision"]
    cpath = os.path.join(a.out, "config.json")
    with open(cpath) as f:
        doc = json.load(f)
    doc["image_token_id"] = st["image_token_id"]
    doc["vision_config"] = vision_config(vc)
    spath = os.path.join(a.out, "model.safetensors")
    tensors = {n: v for n, v in read_raw(spath).items() if not (n.startswith("vision.") or n.startswith("aligner.")
                                                                 or n.startswith("image_"))}
    for key, name in tower_names(vc["num_hidden_layers"]).items():
        w = st["tower"][key].detach().float().numpy().astype(np.float32)
        bits, _ = bf16(w)
        tensors[name] = ("BF16", w.shape, bits)
    tmp = cpath + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2, ensure_ascii=False)
    _, flat = load_config(tmp)
    n = write_safetensors(spath, tensors, tensor_list(flat, vision=True))
    os.replace(tmp, cpath)
    print("wrote %s (%d tensors, %d bytes) and %s" % (spath, len(tensors), n, cpath))


if __name__ == "__main__":
    main()
