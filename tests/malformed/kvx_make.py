#!/usr/bin/env python3
"""Writes the KV transfer frame corpus (src/store/kvx_frame.h): valid seeds in
fuzz/corpus/fuzz_kvx/ and malformed frames in tests/malformed/kvx/ (each must be refused by
ds41_kvx_parse; tests/test_kvx.c checks both). Run from the repository root; deterministic."""
import os
import struct


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def frame(typ, req=1, seq=0, layer=-1, a0=0, a1=0, payload=b"", version=1, magic=b"DKVX",
          length=None, hcrc=None, pcrc=None, reserved=0):
    n = len(payload) if length is None else length
    h = magic + struct.pack("<HHQIiIII", version, typ, req, seq, layer, a0, a1, n)
    h += struct.pack("<I", crc32c(h) if hcrc is None else hcrc)
    h += struct.pack("<II", (crc32c(payload) if payload else 0) if pcrc is None else pcrc, reserved)
    assert len(h) == 48
    return h + payload


ids = struct.pack("<128i", *range(128))
h32 = bytes(range(32))
good = {
    "hello": frame(1, payload=h32),
    "welcome": frame(2, a0=1, a1=4, payload=h32),
    "req": frame(3, a0=0, payload=ids),
    "layer": frame(4, layer=2, a0=0, a1=0, seq=1, payload=bytes(range(256)) * 2),
    "done": frame(5, seq=2, a0=1, a1=4),
    "error": frame(6, a0=1, payload=b"compatibility hash mismatch"),
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
    "version_2": frame(1, version=2, payload=h32),
    "type_0": frame(0),
    "type_7": frame(7),
    "length_too_big": frame(4, length=0xFFFFFFF0),
    "length_mismatch": frame(3, length=8, payload=b"1234"),
    "reserved_set": frame(5, reserved=1),
    "empty_with_crc": frame(5, pcrc=5),
}
os.makedirs("fuzz/corpus/fuzz_kvx", exist_ok=True)
os.makedirs("tests/malformed/kvx", exist_ok=True)
for k, v in good.items():
    open(f"fuzz/corpus/fuzz_kvx/{k}", "wb").write(v)
for k, v in bad.items():
    open(f"tests/malformed/kvx/{k}", "wb").write(v)
