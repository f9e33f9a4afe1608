#!/usr/bin/env python3
"""Writes tests/malformed/serve-guard/NAME/{message,fds,expected}: messages of rank 0 to its 503
guard (src/serve/serve_mpi_wire.c, ds41_sguard_decode) that must be refused, each with the one
line the decoder gives; and the fuzz seeds fuzz/corpus/fuzz_serve_guard/ (a byte with the
number of descriptors, then a valid message). message: the bytes in hex."""
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MAGIC = 0x44534731


def msg(op, id_=0, flags=0, written=0, nf=0, nt=0, payload=b"", magic=MAGIC):
    return struct.pack("<IIIIqII", magic, op, id_, flags, written, nf, nt) + payload


FULL = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}"
TAIL = b"data: {}\n\n"
CASES = {
    "short": (b"\x31\x47\x53\x44" + b"\0" * 6, 0, "serve guard: a message of 10 bytes, shorter than its 32-byte header"),
    "bad-magic": (msg(2, 1, magic=0x44534730), 0, "serve guard: bad magic 0x44534730"),
    "op-zero": (msg(0, 1), 0, "serve guard: unknown operation 0"),
    "op-four": (msg(4, 1), 0, "serve guard: unknown operation 4"),
    "done-with-bytes": (msg(2, 7) + b"xy", 0, "serve guard: DONE carries 2 bytes, 0 + 0 answer bytes and 0 descriptors (expected none)"),
    "done-with-fd": (msg(2, 7), 1, "serve guard: DONE carries 0 bytes, 0 + 0 answer bytes and 1 descriptors (expected none)"),
    "bye-with-sizes": (msg(3, 0, nf=5), 0, "serve guard: BYE carries 0 bytes, 5 + 0 answer bytes and 0 descriptors (expected none)"),
    "open-no-fd": (msg(1, 3, nf=len(FULL), payload=FULL), 0, "serve guard: OPEN 3 carries 0 descriptors (expected 1)"),
    "open-two-fds": (msg(1, 3, nf=len(FULL), payload=FULL), 2, "serve guard: OPEN 3 carries 2 descriptors (expected 1)"),
    "open-id-zero": (msg(1, 0, nf=len(FULL), payload=FULL), 1, "serve guard: OPEN with id 0"),
    "open-unknown-flags": (msg(1, 3, flags=2, nf=len(FULL), payload=FULL), 1, "serve guard: OPEN 3: unknown flags 0x2"),
    "open-negative-written": (msg(1, 3, written=-5, nf=len(FULL), payload=FULL), 1, "serve guard: OPEN 3: -5 bytes written"),
    "open-no-reply": (msg(1, 3, nf=0, nt=len(TAIL), flags=1, payload=TAIL), 1,
                      "serve guard: OPEN 3: 0 + 10 answer bytes in a message of 42 (expected a 503 reply and the rest the stream's tail)"),
    "open-sizes-short": (msg(1, 3, nf=len(FULL) + 1, payload=FULL), 1,
                         "serve guard: OPEN 3: %d + 0 answer bytes in a message of %d (expected a 503 reply and the rest the stream's tail)"
                         % (len(FULL) + 1, 32 + len(FULL))),
    "open-sizes-wrap": (msg(1, 3, nf=0xffffffff, nt=len(FULL) + 1, payload=FULL), 1,
                        "serve guard: OPEN 3: 4294967295 + %d answer bytes in a message of %d (expected a 503 reply and the rest the stream's tail)"
                        % (len(FULL) + 1, 32 + len(FULL))),
    "open-stream-no-tail": (msg(1, 3, flags=1, nf=len(FULL), payload=FULL), 1, "serve guard: OPEN 3: a stream without a tail"),
}
SEEDS = {
    "open_plain": (1, msg(1, 1, written=0, nf=len(FULL), payload=FULL)),
    "open_stream": (1, msg(1, 2, flags=1, written=4096, nf=len(FULL), nt=len(TAIL), payload=FULL + TAIL)),
    "done": (0, msg(2, 1)),
    "bye": (0, msg(3)),
}

for name, (m, fds, want) in CASES.items():
    d = os.path.join(ROOT, "tests", "malformed", "serve-guard", name)
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "message"), "w").write(m.hex() + "\n")
    open(os.path.join(d, "fds"), "w").write("%d\n" % fds)
    open(os.path.join(d, "expected"), "w").write(want + "\n")
for name, (fds, m) in SEEDS.items():
    open(os.path.join(ROOT, "fuzz", "corpus", "fuzz_serve_guard", name), "wb").write(bytes([fds]) + m)
