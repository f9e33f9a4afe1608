#!/usr/bin/env -S /usr/bin/python3
"""The committed format vectors (tests/data/formats/) are exactly what
tools/format_vectors.py writes, and the NumPy side itself agrees with the
spec's worked examples (spec 7.2 - 7.4). Prints PASS/FAIL lines."""
import os
import sys
import tempfile

import numpy as np

ROOT = os.environ.get("DS41_ROOT") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import format_vectors as fv  # noqa: E402

np.seterr(invalid="ignore")
DATA = os.path.join(ROOT, "tests", "data", "formats")
failed = 0


def case(name, ok, why=""):
    global failed
    if ok:
        print(f"PASS {name}")
    else:
        failed += 1
        print(f"FAIL {name}: {why}")


def regenerated_equal_committed():
    with tempfile.TemporaryDirectory() as tmp:
        fv.generate(tmp)
        new = sorted(os.listdir(tmp))
        old = sorted(os.listdir(DATA)) if os.path.isdir(DATA) else []
        if new != old:
            return case("vectors_regenerate_identically", False, f"files {old} vs regenerated {new}")
        diff = [n for n in new if open(os.path.join(tmp, n), "rb").read() != open(os.path.join(DATA, n), "rb").read()]
        case("vectors_regenerate_identically", not diff, f"differ: {diff}")
        total = sum(os.path.getsize(os.path.join(DATA, n)) for n in old)
        case("vectors_small", total < 2 * 1024 * 1024, f"{total} bytes")


def spec_examples():
    F = np.float32
    # E2M1 (spec 7.3): 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5.0 -> 4.0
    x = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0, 7.0], dtype=F)
    got = fv.e2m1_table()[fv.e2m1_encode(x)]
    case("numpy_e2m1_examples", list(got) == [0, 1, 1, 2, 2, 4, 4, 0, 6] and fv.e2m1_encode(x)[7] == 8, str(got))
    # E4M3 (spec 7.2): max 448, smallest subnormal 2^-9, saturation
    x = np.array([448, 1e6, -np.inf, 2.0 ** -9, 2.0 ** -10, -0.0], dtype=F)
    got = [int(c) for c in fv.e4m3_encode(x)]
    case("numpy_e4m3_examples", got == [0x7E, 0x7E, 0xFE, 0x01, 0x00, 0x80], str(got))
    # pow2ceil: exact power stays, anything above goes up
    a = np.array([0.25, np.nextafter(F(0.25), F(1))], dtype=F)
    got = fv.pow2ceil(a, np.array([1, 1], dtype=F))
    case("numpy_pow2ceil_examples", list(got) == [0.25, 0.5], str(got))
    # zero groups: Q8 scale 2^-22 (byte 105), Q4mx 2^-126 (byte 1), Q4nv E4M3 2^-9 (code 1)
    z32 = np.zeros((1, 32), dtype=np.uint16)
    z16 = np.zeros((1, 16), dtype=np.uint16)
    s8, s4, snv = fv.q8(z32)[1][0], fv.q4mx(z32)[1][0], fv.q4nv(z16)[1][0]
    case("numpy_zero_group_scales", (s8, s4, snv) == (105, 1, 1), str((s8, s4, snv)))
    # BF16: 1 + 2^-8 is a tie -> 1.0 (even); 1 + 3 * 2^-8 -> 1 + 2^-6
    b = fv.bits_from_f32(np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8], dtype=F))
    got = [int(h) for h in fv.bf16_encode(b)]
    case("numpy_bf16_ties", got == [0x3F80, 0x3F82], str([hex(g) for g in got]))
    # the Q4nv division vs multiply: never differs for BF16 amax, does for some FP32 amax
    case("numpy_q4nv_divmul", fv.bf16_divmul_count() == 0 and len(fv.q4nv_divmul_cases()[0]) > 0,
         f"bf16 cases {fv.bf16_divmul_count()}")


regenerated_equal_committed()
spec_examples()
sys.exit(1 if failed else 0)
