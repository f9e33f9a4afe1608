#!/usr/bin/env python3
"""Replaces only the DSpark tensors (`mtp.*`) of a release checkpoint, or (--part text) its whole
language model, and checks that nothing else changed.

    python3 tools/train/dspark_swap.py merge --base models/demo/model.safetensors \\
        --drafter build/dspark-export/model.safetensors --out build/dspark-cand/model.safetensors
    python3 tools/train/dspark_swap.py check --old models/demo/model.safetensors \\
        --new build/dspark-cand/model.safetensors

merge: the output is the base file with the data of every `mtp.*` tensor taken from the
drafter file (same names, dtypes and shapes required): the same header, the same offsets, and
every other byte the base file's. `--part text` takes every tensor of the drafter file that is
not the vision tower's (`vision.*`, `aligner.*`, `image_*`): a text model trained on from the
release (train.py --init-release --release-phase sparse) put back beside the tower it lacks.
A re-export of the backbone is not byte-identical in general
(the exporter's scale choice on already-quantized values can pick a different power of two
for an FP8 tile with the same decoded values), so the backbone is never re-exported.

check: every tensor that is not `mtp.*` (--part text: every tower tensor) has the same dtype, shape and bytes in both files, the
two files hold the same tensor names, and the header metadata is equal; prints how many DSpark
tensors differ. Exit status 1 on any backbone difference."""

import argparse
import json
import os
import sys


def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    return raw, 8 + n, hdr


def tensors(hdr):
    return {k: v for k, v in hdr.items() if k != "__metadata__"}


def data(raw, base, t):
    a, b = t["data_offsets"]
    return raw[base + a:base + b]


def is_dspark(name):
    return name.startswith("mtp.")


def is_tower(name):
    return name.startswith(("vision.", "aligner.", "image_"))


def in_part(name, part):
    """The tensors merge replaces and check lets change."""
    return is_dspark(name) if part == "dspark" else not is_tower(name)


def merge(args):
    braw, bbase, bhdr = read_st(args.base)
    draw, dbase, dhdr = read_st(args.drafter)
    bt, dt = tensors(bhdr), tensors(dhdr)
    out = bytearray(braw)
    n = 0
    for name, t in bt.items():
        if not in_part(name, args.part):
            continue
        if name not in dt:
            sys.exit("merge: %s is not in %s" % (name, args.drafter))
        u = dt[name]
        if (u["dtype"], u["shape"]) != (t["dtype"], t["shape"]):
            sys.exit("merge: %s is %s %s in the drafter file, %s %s in the base" % (name, u["dtype"], u["shape"],
                                                                                 t["dtype"], t["shape"]))
        a, b = t["data_offsets"]
        src = data(draw, dbase, u)
        if len(src) != b - a:
            sys.exit("merge: %s: %d bytes, expected %d" % (name, len(src), b - a))
        out[bbase + a:bbase + b] = src
        n += 1
    extra = sorted(k for k in dt if in_part(k, args.part) and k not in bt)
    if extra:
        sys.exit("merge: the drafter file has %s tensors the base lacks: %s" % (args.part, extra[:5]))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(out)
    os.replace(tmp, args.out)
    print("merge: %s = %s with %d %s tensors from %s" % (args.out, args.base, n, args.part, args.drafter))


def check(args):
    oraw, obase, ohdr = read_st(args.old)
    nraw, nbase, nhdr = read_st(args.new)
    ot, nt = tensors(ohdr), tensors(nhdr)
    bad = []
    if set(ot) != set(nt):
        bad.append("tensor names differ: only old %s, only new %s" % (sorted(set(ot) - set(nt))[:5],
                                                                     sorted(set(nt) - set(ot))[:5]))
    if ohdr.get("__metadata__") != nhdr.get("__metadata__"):
        bad.append("header metadata differs")
    same_bb = changed_ds = n_ds = 0
    for name in sorted(set(ot) & set(nt)):
        o, n = ot[name], nt[name]
        same = (o["dtype"], o["shape"]) == (n["dtype"], n["shape"]) and data(oraw, obase, o) == data(nraw, nbase, n)
        if in_part(name, args.part):
            n_ds += 1
            changed_ds += not same
        elif same:
            same_bb += 1
        else:
            bad.append("%s tensor %s differs" % ("backbone" if args.part == "dspark" else "tower", name))
    n_bb = sum(1 for k in ot if not in_part(k, args.part))
    kept, moved = ("backbone", "DSpark") if args.part == "dspark" else ("tower", "text")
    print("check: %d of %d %s tensors byte-identical; %d of %d %s tensors changed" % (same_bb, n_bb, kept, changed_ds,
                                                                                    n_ds, moved))
    for b in bad[:20]:
        print("check: " + b)
    sys.exit(1 if bad else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge")
    m.add_argument("--base", required=True)
    m.add_argument("--drafter", required=True)
    m.add_argument("--out", required=True)
    c = sub.add_parser("check")
    c.add_argument("--old", required=True)
    c.add_argument("--new", required=True)
    for p in (m, c):
        p.add_argument("--part", choices=("dspark", "text"), default="dspark",
                       help="what is replaced: the DSpark stages (default) or the whole language model")
    args = ap.parse_args()
    merge(args) if args.cmd == "merge" else check(args)


if __name__ == "__main__":
    main()
