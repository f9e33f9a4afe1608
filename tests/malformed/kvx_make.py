#!/usr/bin/env python3
"""Writes the KV transfer frame corpus (src/store/kvx_frame.h): valid seeds in
fuzz/corpus/fuzz_kvx/, malformed frames in tests/malformed/kvx/ (each must be refused by
ds41_kvx_parse) and well-formed RESUME frames whose payload is malformed in
tests/malformed/kvx_resume/ (each must be refused by ds41_kvx_resume_parse against the geometry
of fuzz/kvx_test_geom.h); tests/test_kvx.c checks all three. Run from the repository root;
deterministic."""
import os
import struct


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def frame(typ, req=1, seq=0, layer=-1, a0=0, a1=0, payload=b"", version=3, magic=b"DKVX",
          length=None, hcrc=None, pcrc=None, reserved=0):
    n = len(payload) if length is None else length
    h = magic + struct.pack("<HHQIiIII", version, typ, req, seq, layer, a0, a1, n)
    h += struct.pack("<I", crc32c(h) if hcrc is None else hcrc)
    h += struct.pack("<II", (crc32c(payload) if payload else 0) if pcrc is None else pcrc, reserved)
    assert len(h) == 48
    return h + payload


# RESUME payload (src/store/kvx_resume.h) for fuzz/kvx_test_geom.h: 2 rings x 4 slots x 8 B,
# one compressor (layer 1, ratio 2, dim 4), context rows of 6 BF16 values, position 256; the
# decoder split form (stream > 0): ring 0 only, 3 stream rows of 5 FP32 values
def resume(pos=256, n_rings=None, slots=4, rec=8, n_comp=1, owner=2, mh_rows=None, width=6, stream=0,
           stream_body=None, mh_pos0=None, hist=(3, 1), comp=((1, 2, 4),), body_extra=0, cut=0):
    if n_rings is None:
        n_rings = 1 if stream else 2
    if mh_rows is None:
        mh_rows = 0 if stream else 4
    if stream_body is None:
        stream_body = stream
    if mh_pos0 is None:
        mh_pos0 = pos - mh_rows
    h = struct.pack("<qIIIIiIII", pos, n_rings, slots, rec, n_comp, owner, mh_rows, width, stream)
    h += struct.pack("<q", mh_pos0)
    h += struct.pack("<16i", *(list(hist) + [0] * (16 - len(hist))))
    for c in comp:
        h += struct.pack("<3i", *c)
    body = bytes(range((1 if stream_body else 2) * 4 * 8))   # rings
    body += struct.pack("<16f", *([0.5] * 8 + [-1.0] * 8))  # kv, score
    body += struct.pack("<%dH" % (4 * 6), *range(0x3f80, 0x3f80 + 4 * 6))[:mh_rows * 6 * 2]
    body += struct.pack("<%df" % (stream_body * 5), *[0.25 * i for i in range(stream_body * 5)])
    body += b"\0" * body_extra
    p = h + body
    return p[:len(p) - cut] if cut else p


ids = struct.pack("<128i", *range(128))
h32 = bytes(range(32))
good = {
    "hello": frame(1, payload=h32),
    "welcome": frame(2, a0=1, a1=4, payload=h32),
    "req": frame(3, a0=0, payload=ids),
    "layer": frame(4, layer=2, a0=0, a1=0, seq=1, payload=bytes(range(256)) * 2),
    "done": frame(5, seq=2, a0=1, a1=4),
    "error": frame(6, a0=1, payload=b"compatibility hash mismatch"),
    "resume": frame(7, seq=3, payload=resume()),
    "resume_no_context": frame(7, seq=3, payload=resume(mh_rows=0)),
    "resume_stream": frame(7, seq=3, payload=resume(stream=3)),
}
g = good["layer"]
bad = {
    "empty": b"",
    "header_only_short": g[:47],
    "truncated_payload": g[:-1],
    "trailing_byte": g + b"\0",
    "bad_magic": frame(4, magic=b"DKVY", payload=b"x"),
    "flipped_header": g[:10] + bytes([g[10] ^ 1]) + g[11:],
    "flipped_payload": g[:100] + bytes([g[100] ^ 0x80]) + g[101:],
    "bad_payload_crc": frame(4, payload=b"abc", pcrc=1),
    "version_1": frame(1, version=1, payload=h32),
    "version_2": frame(1, version=2, payload=h32),
    "type_0": frame(0),
    "type_8": frame(8),
    "resume_flipped": (lambda f: f[:130] + bytes([f[130] ^ 4]) + f[131:])(frame(7, payload=resume())),
    "length_too_big": frame(4, length=0xFFFFFFF0),
    "length_mismatch": frame(3, length=8, payload=b"1234"),
    "reserved_set": frame(5, reserved=1),
    "empty_with_crc": frame(5, pcrc=5),
}
bad_resume = {
    "short_head": resume()[:100],
    "wrong_position": resume(pos=384),
    "ring_count": resume(n_rings=3),
    "ring_slots": resume(slots=8),
    "record_bytes": resume(rec=9),
    "compressor_count": resume(n_comp=2),
    "compressor_ratio": resume(comp=((1, 4, 4),)),
    "compressor_layer": resume(comp=((2, 2, 4),)),
    "owner_too_big": resume(owner=3),
    "owner_below": resume(owner=-2),
    "context_too_many": resume(mh_rows=5),
    "context_wrong_start": resume(mh_pos0=251),
    "context_width": resume(width=7),
    "stream_rows_short": resume(stream=2),
    "stream_rows_long": resume(stream=4),
    "stream_with_context": resume(stream=3, mh_rows=2),
    "stream_all_rings": resume(stream=3, n_rings=2),
    "stream_body_missing": resume(stream=3, stream_body=0, n_rings=1),
    "stream_cut": resume(stream=3, cut=4),
    "stream_trailing": resume(stream=3, body_extra=4),
    "history_negative": resume(hist=(3, -1)),
    "history_too_big": resume(hist=(10,)),
    "trailing_byte": resume(body_extra=1),
    "truncated_body": resume(cut=1),
    "context_cut": resume(cut=12),
}
os.makedirs("tests/malformed/kvx_resume", exist_ok=True)
for k, v in bad_resume.items():
    open(f"tests/malformed/kvx_resume/{k}", "wb").write(frame(7, seq=3, payload=v))
os.makedirs("fuzz/corpus/fuzz_kvx", exist_ok=True)
os.makedirs("tests/malformed/kvx", exist_ok=True)
for k, v in good.items():
    open(f"fuzz/corpus/fuzz_kvx/{k}", "wb").write(v)
for k, v in bad.items():
    open(f"tests/malformed/kvx/{k}", "wb").write(v)
