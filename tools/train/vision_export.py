#!/usr/bin/env python3
"""Adds the trained vision tower (vision_train.py) to a copy of models/demo (or to models/demo in
place): the tower, aligner and image vectors as BF16 tensors under the official names
(docs/vision.md), the vision_config and image_token_id in config.json. When the state also holds
language-model weights (vision_train.py --train-lm), every release tensor whose trained values
decode differently from the base file's is quantized again in its release format
(export.encode: FP8 tiles, FP4 rows, E4M3 rows, BF16, F32); every other text tensor keeps its
bytes (read from the base file and written back unchanged; ffn.gate.bias_vl stays equal to
ffn.gate.bias). The whole set is checked against make_checkpoint.tensor_list with the tower, and
written by export.write_safetensors.

    python3 tools/train/vision_export.py --state build/demo-vision/vision_state.pt --out models/demo
    python3 tools/train/vision_export.py --state ... --base models/demo --out build/demo-vision/model

--base (default: --out) is the checkpoint the state was trained on; a different --out gets a copy
of its other files first. A state with language-model weights must name the base file it was
trained on (its sha256 is in the state)."""

import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import export  # noqa: E402
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


def lm_update(base_dir, trained):
    """trained: {v41 state-dict key: tensor} (vision_state.pt's "lm") -> ({file name: (dtype, shape,
    data)} of the release tensors whose values changed, their base names). A tensor is changed when
    its trained values, in its release format, decode to anything else than the base file's values;
    the others are left out (the caller keeps their bytes: quantizing decoded values again gives the
    same values but not always the same bytes, tools/train/README.md)."""
    import v41
    with open(os.path.join(base_dir, "config.json")) as f:
        model = v41.V41(json.load(f))
    old = export.load_release(model, base_dir)
    unknown = sorted(set(trained) - set(old))
    if unknown:
        raise SystemExit("vision_export: the state's language-model weights name %s, which %s does not have"
                         % (unknown[0], base_dir))
    files, bases = {}, []
    for base, (key, kind) in export.source_map(model).items():
        if key is None or key not in trained:
            continue
        w = trained[key].detach().float().numpy().astype(np.float32)
        if w.shape != tuple(old[key].shape):
            raise SystemExit("vision_export: %s has shape %s in the state, %s in %s"
                             % (key, w.shape, tuple(old[key].shape), base_dir))
        got, dec = export.encode(base, kind, w)
        if np.array_equal(dec, old[key].numpy()):
            continue
        files.update(got)
        bases.append(base)
    return files, bases


def vision_config(vc):
    side = vision_data.SIZE
    return dict({"model_type": "deepseek_v41_vision"}, **vc, max_image_tokens=1024,
                min_pixels=side * side)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", default="build/demo-vision/vision_state.pt")
    ap.add_argument("--out", default="models/demo")
    ap.add_argument("--base", default=None, help="the checkpoint the state was trained on (default: --out)")
    a = ap.parse_args()
    base = a.base or a.out
    st = torch.load(a.state)
    vc = st["vision"]
    trained = st.get("lm") or {}
    if trained:
        from vision_train import file_sha256
        sha = file_sha256(os.path.join(base, "model.safetensors"))
        if st.get("base_sha256") != sha:
            raise SystemExit("vision_export: %s trained the language model of a model.safetensors of sha256 %s; "
                             "%s/model.safetensors has %s (name the file it was trained on with --base)"
                             % (a.state, st.get("base_sha256"), base, sha))
    if os.path.abspath(base) != os.path.abspath(a.out):
        shutil.copytree(base, a.out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("model.safetensors*"))
    with open(os.path.join(base, "config.json")) as f:
        doc = json.load(f)
    doc["image_token_id"] = st["image_token_id"]
    doc["vision_config"] = vision_config(vc)
    cpath = os.path.join(a.out, "config.json")
    tensors = {n: v for n, v in read_raw(os.path.join(base, "model.safetensors")).items()
               if not (n.startswith("vision.") or n.startswith("aligner.") or n.startswith("image_"))}
    changed = []
    if trained:
        files, changed = lm_update(base, trained)
        tensors.update(files)
    for key, name in tower_names(vc["num_hidden_layers"]).items():
        w = st["tower"][key].detach().float().numpy().astype(np.float32)
        bits, _ = bf16(w)
        tensors[name] = ("BF16", w.shape, bits)
    tmp = cpath + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2, ensure_ascii=False)
    _, flat = load_config(tmp)
    spath = os.path.join(a.out, "model.safetensors")
    n = write_safetensors(spath, tensors, tensor_list(flat, vision=True))
    os.replace(tmp, cpath)
    print("wrote %s (%d tensors, %d bytes) and %s; language model: %d release tensors changed%s"
          % (spath, len(tensors), n, cpath, len(changed), (" (%s ...)" % ", ".join(changed[:3])) if changed else ""))


if __name__ == "__main__":
    main()
