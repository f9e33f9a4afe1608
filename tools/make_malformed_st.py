#!/usr/bin/env -S /usr/bin/python3
"""Writes the malformed safetensors corpus (tests/malformed/st/) and the fuzz seeds
(fuzz/corpus/fuzz_safetensors/).

Each case is a directory tests/malformed/st/NAME/ holding
  expected            one line: a substring the loader's error message must contain
  model.safetensors   the input, for single-file cases, or
  ckpt/               the input directory, for sharded / directory cases.
tests/test_safetensors.c opens every case and checks the failure and the message.
The outputs are deterministic; rerun after changing a case and commit the result.

  make_malformed_st.py [--out tests/malformed/st] [--seeds fuzz/corpus/fuzz_safetensors]
  make_malformed_st.py --sparse DIR [--shards 8] [--shard-mib 1024] [--tensors 50000]
      writes a sharded checkpoint of sparse files (headers only, the data section is a
      hole made by truncate), for measuring that opening touches no tensor data.
"""
import argparse
import json
import os
import shutil
import struct

MAX_HEADER = 256 << 20   # DS41_ST_MAX_HEADER


def header_text(obj):
    return json.dumps(obj, separators=(",", ":"))


def st_image(header, data=b"", pad=True, hlen=None):
    """header: dict (serialized) or str/bytes (used verbatim). Pads the header with
    spaces so that the data section starts on an 8-byte boundary, as writers do."""
    if isinstance(header, dict):
        header = header_text(header)
    if isinstance(header, str):
        header = header.encode("utf-8")
    if pad:
        header += b" " * ((-(8 + len(header))) % 8)
    n = len(header) if hlen is None else hlen
    return struct.pack("<Q", n) + header + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def base_tensors():
    """A valid two-tensor header: a = F32 [2, 2] at [0, 16), b = BF16 [3] at [16, 22)."""
    return {"__metadata__": {"format": "pt"}, "a": t("F32", [2, 2], 0, 16), "b": t("BF16", [3], 16, 22)}


DATA22 = bytes(range(22))


def single_cases():
    c = {}
    c["truncated_short_file"] = (b"\x10\x00\x00\x00\x00", "truncated")
    c["truncated_empty_file"] = (b"", "truncated")
    c["header_len_past_file"] = (struct.pack("<Q", 1000) + b'{"a":1}', "larger than the file")
    c["header_len_over_cap"] = (struct.pack("<Q", MAX_HEADER + 1) + b"{}      ", "exceeds the cap")
    c["header_len_u64_max"] = (struct.pack("<Q", (1 << 64) - 1) + b"{}      ", "exceeds the cap")
    c["invalid_json"] = (st_image('{"a": {"dtype": "F32", "shape": [2, 2],'), "header JSON invalid")
    c["empty_header"] = (st_image(b"", pad=False), "header JSON invalid")
    c["header_trailing_garbage"] = (st_image('{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}} xx', b"\x01"),
                                    "header JSON invalid")
    c["header_not_object"] = (st_image("[1, 2, 3]"), "header is a JSON array, expected an object")
    c["control_char_in_name"] = (st_image(b'{"a\x01b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', b"\x01"),
                                 "header JSON invalid")
    c["invalid_utf8_name"] = (st_image(b'{"a\xff": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', b"\x01"),
                              "header JSON invalid")
    c["integer_too_big"] = (st_image('{"a": {"dtype": "U8", "shape": [99999999999999999999], "data_offsets": [0, 1]}}', b"\x01"),
                            "header JSON invalid")
    h = base_tensors(); h["b"]["dtype"] = "F33"
    c["unknown_dtype"] = (st_image(h, DATA22), "tensor 'b': unknown dtype 'F33'")
    h = base_tensors(); h["b"]["dtype"] = "bf16"
    c["dtype_wrong_case"] = (st_image(h, DATA22), "tensor 'b': unknown dtype 'bf16'")
    h = base_tensors(); h["a"]["dtype"] = 4
    c["dtype_not_string"] = (st_image(h, DATA22), "tensor 'a': dtype is a JSON integer")
    h = base_tensors(); h["a"]["shape"] = [2, 3]
    c["shape_size_mismatch"] = (st_image(h, DATA22), "tensor 'a': shape [2, 3] x 4-byte F32 is 24 bytes but data_offsets [0, 16] span 16")
    h = base_tensors(); h["a"]["shape"] = [-2, -2]
    c["negative_dim"] = (st_image(h, DATA22), "tensor 'a': shape[0] is -2")
    h = base_tensors(); h["a"]["shape"] = [1 << 32, 1 << 32, 16]
    c["dims_product_overflow"] = (st_image(h, DATA22), "tensor 'a': shape [4294967296, 4294967296, 16] x 4-byte F32 overflows")
    h = base_tensors(); h["a"]["shape"] = [1 << 62]
    c["bytes_overflow"] = (st_image(h, DATA22), "tensor 'a': shape [4611686018427387904] x 4-byte F32 overflows")
    h = {"big": t("U8", [1 << 62], 0, 1 << 62)}
    c["huge_tensor_past_file"] = (st_image(h, b"\0" * 8), "tensor 'big': data_offsets [0, 4611686018427387904] end past the data section")
    h = base_tensors()
    c["offsets_past_file"] = (st_image(h, DATA22[:20]), "tensor 'b': data_offsets [16, 22] end past the data section")
    h = base_tensors(); h["b"]["data_offsets"] = [22, 16]
    c["begin_after_end"] = (st_image(h, DATA22), "tensor 'b': data_offsets [22, 16] has begin > end")
    h = base_tensors(); h["b"]["data_offsets"] = [10, 16]
    c["overlapping_ranges"] = (st_image(h, DATA22), "tensors 'a' [0, 16] and 'b' [10, 16] overlap at data offset 10")
    h = {"a": t("U8", [16], 0, 16), "b": t("U8", [4], 4, 8), "c": t("U8", [4], 12, 16)}
    c["range_inside_range"] = (st_image(h, bytes(16)), "tensors 'a' [0, 16] and 'b' [4, 8] overlap")
    dup = ('{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
           '"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}')
    c["duplicate_name"] = (st_image(dup, b"\x01\x02"), "duplicate object key")
    h = base_tensors(); h["a"]["shape"] = [2.0, 2]
    c["shape_real_number"] = (st_image(h, DATA22), "tensor 'a': shape[0] is a JSON real number")
    h = base_tensors(); h["a"]["shape"] = "2x2"
    c["shape_not_array"] = (st_image(h, DATA22), "tensor 'a': shape is a JSON string")
    h = base_tensors(); h["a"]["shape"] = [1] * 9; h["a"]["dtype"] = "U8"; h["a"]["data_offsets"] = [0, 1]
    c["too_many_dims"] = (st_image(h, DATA22), "tensor 'a': shape has 9 dimensions, at most 8")
    h = {"pad": t("BF16", [1], 0, 2), "w": t("F32", [1], 2, 6)}
    c["misaligned_f32"] = (st_image(h, bytes(8)), "tensor 'w': data at file offset")
    h = {"pad": t("U8", [1], 0, 1), "w": t("BF16", [2], 1, 5)}
    c["misaligned_bf16"] = (st_image(h, bytes(8)), "not aligned to its 2-byte BF16 elements")
    w = '{"w": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}'   # no padding: data at 8 + len(w)
    c["unpadded_misaligned_data_section"] = (st_image(w, bytes(4), pad=False),
                                             "tensor 'w': data at file offset %d is not aligned" % (8 + len(w)))
    h = base_tensors(); del h["a"]["data_offsets"]
    c["missing_data_offsets"] = (st_image(h, DATA22), "tensor 'a': missing field 'data_offsets'")
    h = base_tensors(); del h["b"]["dtype"]
    c["missing_dtype"] = (st_image(h, DATA22), "tensor 'b': missing field 'dtype'")
    h = base_tensors(); h["a"]["strides"] = [2, 1]
    c["unexpected_field"] = (st_image(h, DATA22), "tensor 'a': unexpected field 'strides'")
    h = base_tensors(); h["a"]["data_offsets"] = [0]
    c["data_offsets_wrong_length"] = (st_image(h, DATA22), "tensor 'a': data_offsets is a JSON array of the wrong length")
    h = base_tensors(); h["a"]["data_offsets"] = [-4, 12]
    c["negative_offset"] = (st_image(h, DATA22), "tensor 'a': data_offsets[0] is -4")
    h = base_tensors(); h["a"]["data_offsets"] = [0, "16"]
    c["offset_not_integer"] = (st_image(h, DATA22), "tensor 'a': data_offsets[1] is a JSON string")
    h = base_tensors(); h["__metadata__"] = {"format": 1}
    c["metadata_not_string"] = (st_image(h, DATA22), "__metadata__ entry 'format' is a JSON integer")
    h = base_tensors(); h["__metadata__"] = ["pt"]
    c["metadata_not_object"] = (st_image(h, DATA22), "__metadata__ is a JSON array")
    h = base_tensors(); h["a"] = [1, 2]
    c["tensor_entry_not_object"] = (st_image(h, DATA22), "tensor 'a': entry is a JSON array")
    h = base_tensors(); h[""] = t("U8", [0], 22, 22)
    c["empty_tensor_name"] = (st_image(h, DATA22), "empty name")
    h = base_tensors(); h["a\nb"] = t("U8", [0], 22, 22); h["a\nb"]["dtype"] = "X"
    c["newline_in_name"] = (st_image(h, DATA22), "tensor 'a\\x0ab': unknown dtype 'X'")
    return c


def write_index(d, weight_map, extra=None):
    obj = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    if extra is not None:
        obj = extra
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def shard(d, name, header, data):
    with open(os.path.join(d, name), "wb") as f:
        f.write(st_image(header, data))


S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def two_shards(d):
    """A valid sharded checkpoint: a, b in shard 1; c in shard 2."""
    shard(d, S1, base_tensors(), DATA22)
    shard(d, S2, {"c": t("I32", [2], 0, 8)}, bytes(8))
    return {"a": S1, "b": S1, "c": S2}


def dir_cases():
    """Each entry: (builder(dir), expected)."""
    c = {}

    def missing_shard(d):
        wm = two_shards(d)
        os.remove(os.path.join(d, S2))
        write_index(d, wm)
    c["index_missing_shard_file"] = (missing_shard, "weight_map['c'] names shard 'model-00002-of-00002.safetensors', but")

    def absent(d):
        wm = two_shards(d); wm["zz"] = S2
        write_index(d, wm)
    c["index_tensor_absent_from_shard"] = (absent, "weight_map['zz'] points at shard 'model-00002-of-00002.safetensors', which has no tensor of that name")

    def wrong_shard(d):
        wm = two_shards(d); wm["b"] = S2
        write_index(d, wm)
    c["index_points_at_wrong_shard"] = (wrong_shard, "weight_map['b'] points at shard 'model-00002-of-00002.safetensors', which has no tensor of that name (it is in")

    def unlisted(d):
        wm = two_shards(d); del wm["b"]
        write_index(d, wm)
    c["shard_tensor_missing_from_index"] = (unlisted, "tensor 'b' is in the shard but missing from")

    def wm_array(d):
        two_shards(d)
        write_index(d, None, {"weight_map": [["a", S1]]})
    c["index_weight_map_not_object"] = (wm_array, "weight_map is a JSON array")

    def no_wm(d):
        two_shards(d)
        write_index(d, None, {"metadata": {"total_size": 38}})
    c["index_without_weight_map"] = (no_wm, "index has no \"weight_map\"")

    def empty_wm(d):
        two_shards(d)
        write_index(d, {})
    c["index_weight_map_empty"] = (empty_wm, "weight_map is empty")

    def idx_array(d):
        two_shards(d)
        write_index(d, None, [S1, S2])
    c["index_not_object"] = (idx_array, "index is a JSON array")

    def idx_bad_json(d):
        two_shards(d)
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            f.write('{"weight_map": {"a": "%s",}}\n' % S1)
    c["index_invalid_json"] = (idx_bad_json, "model.safetensors.index.json: invalid JSON")

    def idx_dup(d):
        two_shards(d)
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            f.write('{"weight_map": {"a": "%s", "b": "%s", "c": "%s", "a": "%s"}}\n' % (S1, S1, S2, S1))
    c["index_duplicate_key"] = (idx_dup, "duplicate object key")

    def idx_value(d):
        wm = two_shards(d); wm["c"] = 2
        write_index(d, wm)
    c["index_value_not_string"] = (idx_value, "weight_map['c'] is a JSON integer, expected a shard file name")

    def idx_escape(d):
        wm = two_shards(d); wm["c"] = "../" + S2
        write_index(d, wm)
    c["index_shard_outside_dir"] = (idx_escape, "expected a file name in the same directory")

    def dup_across(d):
        shard(d, S1, base_tensors(), DATA22)
        shard(d, S2, {"a": t("I32", [2], 0, 8), "c": t("I32", [2], 8, 16)}, bytes(16))
        write_index(d, {"a": S1, "b": S1, "c": S2})
    c["duplicate_tensor_across_shards"] = (dup_across, "model-00002-of-00002.safetensors: tensor 'a' is also in")

    def bad_shard(d):
        wm = two_shards(d)
        with open(os.path.join(d, S2), "wb") as f:
            f.write(b"\x03\x00")
        write_index(d, wm)
    c["index_shard_truncated"] = (bad_shard, "model-00002-of-00002.safetensors: truncated")

    def bad_shard_overlap(d):
        wm = two_shards(d)
        shard(d, S2, {"c": t("I32", [2], 0, 8), "d": t("I32", [1], 4, 8)}, bytes(8))
        wm["d"] = S2
        write_index(d, wm)
    c["index_shard_overlap"] = (bad_shard_overlap, "model-00002-of-00002.safetensors: tensors 'c' [0, 8] and 'd' [4, 8] overlap")

    def empty_dir(d):
        with open(os.path.join(d, "notes.txt"), "w") as f:
            f.write("no weights here\n")
    c["dir_without_safetensors"] = (empty_dir, "directory has no model.safetensors.index.json and no *.safetensors file")

    def two_files(d):
        shard(d, "a.safetensors", {"a": t("U8", [1], 0, 1)}, b"\x01")
        shard(d, "b.safetensors", {"b": t("U8", [1], 0, 1)}, b"\x01")
    c["dir_two_files_without_index"] = (two_files, "*.safetensors files")

    def dir_single_bad(d):
        h = base_tensors(); h["a"]["dtype"] = "FP8"
        shard(d, "weights.safetensors", h, DATA22)
    c["dir_single_file_bad"] = (dir_single_bad, "weights.safetensors: tensor 'a': unknown dtype 'FP8'")
    return c


def seeds():
    """Fuzz seeds: valid images of varied shape plus a few near-misses."""
    s = {}
    s["valid_two"] = st_image(base_tensors(), DATA22)
    s["valid_empty"] = st_image({})
    s["valid_meta_only"] = st_image({"__metadata__": {"format": "pt", "k": "v"}})
    hdr, off, data = {}, 0, b""
    for i, (dt, sz) in enumerate([("F64", 8), ("I64", 8), ("U64", 8), ("F32", 4), ("I32", 4), ("U32", 4),
                                  ("BF16", 2), ("F16", 2), ("I16", 2), ("U16", 2), ("F8_E4M3", 1),
                                  ("F8_E5M2", 1), ("F8_E8M0", 1), ("I8", 1), ("U8", 1), ("BOOL", 1)]):
        n = 2 * (i % 3 + 1)
        hdr["t%02d.%s" % (i, dt.lower())] = t(dt, [n // 2, 2], off, off + n * sz)
        off += n * sz
        data += bytes(n * sz)
    s["valid_all_dtypes"] = st_image(hdr, data)
    s["valid_scalar_and_empty"] = st_image({"s": t("F32", [], 0, 4), "e": t("BF16", [0, 7], 4, 4)}, bytes(4))
    s["valid_8dims"] = st_image({"x": t("U8", [1, 2, 1, 2, 1, 2, 1, 2], 0, 16)}, bytes(16))
    h = base_tensors(); h["b"]["data_offsets"] = [10, 16]
    s["bad_overlap"] = st_image(h, DATA22)
    h = base_tensors(); h["a"]["shape"] = [1 << 32, 1 << 32]
    s["bad_overflow"] = st_image(h, DATA22)
    return s


def reset_dir(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)


def write_corpus(out, seed_dir):
    reset_dir(out)
    n = 0
    for name, (img, exp) in sorted(single_cases().items()):
        d = os.path.join(out, name)
        os.makedirs(d)
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(img)
        with open(os.path.join(d, "expected"), "w") as f:
            f.write(exp + "\n")
        n += 1
    for name, (build, exp) in sorted(dir_cases().items()):
        d = os.path.join(out, name)
        os.makedirs(os.path.join(d, "ckpt"))
        build(os.path.join(d, "ckpt"))
        with open(os.path.join(d, "expected"), "w") as f:
            f.write(exp + "\n")
        n += 1
    # seeds: the valid images plus every single-file malformed case
    reset_dir(seed_dir)
    sd = seeds()
    for name, (img, _) in single_cases().items():
        sd["bad_" + name] = img
    for name, img in sorted(sd.items()):
        with open(os.path.join(seed_dir, name), "wb") as f:
            f.write(img)
    print("wrote %d cases to %s and %d seeds to %s" % (n, out, len(sd), seed_dir))


def write_sparse(out, shards, shard_mib, tensors):
    """Sharded checkpoint whose data sections are holes: only the headers exist on disk."""
    os.makedirs(out, exist_ok=True)
    per = tensors // shards
    shard_bytes = shard_mib << 20
    rows = shard_bytes // per // 128        # BF16 [rows, 64] = rows * 128 bytes per tensor
    wm = {}
    k = 0
    for s in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        hdr, off = {}, 0
        for _ in range(per):
            tn = "layers.%d.ffn.experts.%d.w1.weight" % (k // 256, k % 256)
            hdr[tn] = t("BF16", [rows, 64], off, off + rows * 128)
            off += rows * 128
            wm[tn] = name
            k += 1
        img = st_image(hdr)
        with open(os.path.join(out, name), "wb") as f:
            f.write(img)
            f.truncate(len(img) + off)
    write_index(out, wm)
    print("wrote %d shards, %d tensors, %d data bytes per shard to %s" % (shards, k, rows * 128 * per, out))


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(root, "tests", "malformed", "st"))
    ap.add_argument("--seeds", default=os.path.join(root, "fuzz", "corpus", "fuzz_safetensors"))
    ap.add_argument("--sparse", metavar="DIR")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-mib", type=int, default=1024)
    ap.add_argument("--tensors", type=int, default=50000)
    a = ap.parse_args()
    if a.sparse:
        write_sparse(a.sparse, a.shards, a.shard_mib, a.tensors)
    else:
        write_corpus(a.out, a.seeds)


if __name__ == "__main__":
    main()
