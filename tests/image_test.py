#!/usr/bin/env -S /usr/bin/python3
"""ds41 image against the official preprocessing run by Debian's Pillow and torch.

A corpus of PNG and JPEG files is generated here (sizes and aspect ratios that reach every branch
of the resize plan, greyscale at 1/2/4/8/16 bits, palettes at 2/4/8 bits, alpha, 16-bit RGB,
interlaced PNG, baseline / progressive / greyscale / 4:4:4 / CMYK JPEG, a JPEG with EXIF orientation 6).
For each file and parameter set the oracle opens it with Pillow, converts it to RGB, plans, resizes
or pads it with Pillow and normalises it in torch exactly as the reference's load_image does
(image_processor.py of S1: no EXIF transpose, ImageOps.pad onto grey 127, x/255, (x-0.5)/0.5,
.to(bfloat16)). `ds41 image --json --dump-pixels` must give the same plan and the same BF16 bits,
no tolerance: the preprocessing is integer and correctly rounded arithmetic throughout.

JPEG pixels come from libjpeg. The comparison is bit for bit only because Pillow and ds41 load the
same libjpeg-turbo shared library (checked below, case jpeg_same_library); if they did not, JPEG
cases compare after decoding (the file Pillow decoded, re-encoded losslessly as PNG) and say so.
Prints PASS/FAIL lines. Runtime: about 5 s (torch's import is 2 of them)."""
import io
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np
import torch
from PIL import Image, ImageOps

ROOT = os.environ.get("DS41_ROOT") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DS41 = os.environ.get("DS41") or os.path.join(ROOT, "build", "ds41")
sys.path.insert(0, os.path.join(ROOT, "tests"))
from pycheck import Checks  # noqa: E402

checks = Checks()
case = checks.case


# ---- a PNG writer for what Pillow cannot save (2/4/16-bit greys, 16-bit colour, Adam7) ----

def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def scanlines(a, depth):
    out = bytearray()
    for row in a:
        if depth == 16:
            raw = row.astype(">u2").tobytes()
        elif depth == 8:
            raw = row.astype(np.uint8).tobytes()
        else:  # MSB first, each row padded to a whole byte
            bits = np.unpackbits(row.reshape(-1).astype(np.uint8)[:, None], axis=1)[:, 8 - depth:]
            raw = np.packbits(bits.reshape(-1)).tobytes()
        out += b"\0" + raw
    return bytes(out)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def png_bytes(a, color_type, depth, palette=None, interlace=False, trns=None):
    """a: (h, w, channels) sample values."""
    h, w = a.shape[:2]
    if interlace:
        parts = [a[y0::dy, x0::dx] for x0, y0, dx, dy in ADAM7]
        data = b"".join(scanlines(p, depth) for p in parts if p.shape[0] and p.shape[1])
    else:
        data = scanlines(a, depth)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, int(interlace)))
    if palette is not None:
        out += chunk(b"PLTE", bytes(np.asarray(palette, dtype=np.uint8).reshape(-1)))
    if trns is not None:
        out += chunk(b"tRNS", trns)
    return out + chunk(b"IDAT", zlib.compress(data, 6)) + chunk(b"IEND", b"")


# ---- the corpus ----

def picture(rng, w, h):
    """Smooth content (gradients, a disc) plus noise: every filter tap and both clamps matter."""
    y, x = np.mgrid[0:h, 0:w]
    r = 128 + 120 * np.sin(x / max(w, 1) * 6.0) * np.cos(y / max(h, 1) * 4.0)
    g = 255.0 * x / max(w - 1, 1)
    b = np.where((x - w / 2) ** 2 + (y - h / 2) ** 2 < (min(w, h) / 3) ** 2, 250.0, 5.0)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 12, (h, w, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def corpus(tmp):
    rng = np.random.default_rng(24)
    files = []

    def save_pil(name, im, **kw):
        path = os.path.join(tmp, name)
        im.save(path, **kw)
        files.append(path)

    def save_raw(name, data):
        path = os.path.join(tmp, name)
        open(path, "wb").write(data)
        files.append(path)

    # sizes for the default plan: min_pixels upscale (1x1, 400x300), exact 544x544, the token
    # limit (2000x1500), very wide and very tall (single row / column branches), odd sizes
    for w, h in [(1, 1), (400, 300), (544, 544), (1024, 1024), (2000, 1500), (777, 333), (3000, 40), (40, 3000),
                 (10000, 3), (3, 6000), (14, 14), (97, 1)]:
        save_pil(f"rgb_{w}x{h}.png", Image.fromarray(picture(rng, w, h)))
    base = picture(rng, 320, 200)
    rgba = np.concatenate([base, rng.integers(0, 256, (200, 320, 1), dtype=np.uint8)], axis=-1)
    save_pil("rgba8.png", Image.fromarray(rgba, "RGBA"))
    save_pil("la8.png", Image.fromarray(rgba[..., ::2], "LA"))
    save_pil("grey8.png", Image.fromarray(base[..., 1]))
    save_pil("bilevel.png", Image.fromarray(base[..., 1]).convert("1"))
    save_pil("palette8.png", Image.fromarray(base).quantize(200))
    pt = Image.fromarray(base).quantize(64)
    save_pil("palette_trns.png", pt, transparency=3)
    grey = base[..., 1:2].astype(np.int64)
    save_raw("grey2.png", png_bytes(grey >> 6, 0, 2))
    save_raw("grey4.png", png_bytes(grey >> 4, 0, 4))
    save_raw("grey1_raw.png", png_bytes(grey >> 7, 0, 1))
    save_raw("grey16.png", png_bytes(rng.integers(0, 400, (200, 320, 1)), 0, 16))  # Pillow clamps to 255
    save_raw("grey16_trns.png", png_bytes(rng.integers(0, 300, (40, 30, 1)), 0, 16, trns=struct.pack(">H", 7)))
    save_raw("rgb8_trns.png", png_bytes(picture(rng, 30, 40), 2, 8, trns=struct.pack(">HHH", 1, 2, 3)))
    save_raw("rgb16.png", png_bytes(rng.integers(0, 65536, (150, 170, 3)), 2, 16))
    save_raw("rgba16.png", png_bytes(rng.integers(0, 65536, (150, 170, 4)), 6, 16))
    save_raw("la16.png", png_bytes(rng.integers(0, 65536, (150, 170, 2)), 4, 16))
    pal16 = rng.integers(0, 256, (16, 3))
    save_raw("palette4.png", png_bytes(rng.integers(0, 16, (130, 90, 1)), 3, 4, pal16))
    save_raw("palette2_adam7.png", png_bytes(rng.integers(0, 4, (61, 53, 1)), 3, 2, pal16[:4], interlace=True))
    save_raw("rgb8_adam7.png", png_bytes(picture(rng, 203, 101), 2, 8, interlace=True))
    save_raw("grey16_adam7.png", png_bytes(rng.integers(0, 300, (33, 47, 1)), 0, 16, interlace=True))
    save_raw("rgb8_adam7_tiny.png", png_bytes(picture(rng, 3, 2), 2, 8, interlace=True))
    photo = Image.fromarray(picture(rng, 640, 480))
    save_pil("baseline420.jpg", photo, quality=90)
    save_pil("q444.jpg", photo, quality=95, subsampling=0)
    save_pil("q422.jpg", photo, quality=75, subsampling=1)
    save_pil("progressive.jpg", photo, quality=85, progressive=True)
    save_pil("optimized.jpg", photo, quality=60, optimize=True)
    save_pil("grey.jpg", photo.convert("L"), quality=90)
    save_pil("cmyk.jpg", photo.convert("CMYK"), quality=90)
    save_pil("cmyk_random_k.jpg", Image.fromarray(rng.integers(0, 256, (90, 70, 4), dtype=np.uint8), "CMYK"), quality=95)
    save_pil("odd_size.jpg", Image.fromarray(picture(rng, 333, 77)), quality=80)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 on display; the reference ignores it
    save_pil("exif_orientation6.jpg", Image.fromarray(picture(rng, 300, 200)), quality=90, exif=exif.tobytes())
    return files


# ---- the oracle: the reference's plan and load_image, on Pillow and torch ----

class Params:
    def __init__(self, patch=14, down=3, max_tokens=1024, min_pixels=295936, max_wh_ratio=None):
        self.p, self.r, self.max_tokens, self.min_pixels, self.max_wh_ratio = patch, down, max_tokens, min_pixels, max_wh_ratio


def tokens(nh, nw):
    return nh * (nw + 1) + 2


def grid(bh, bw, P):
    return math.ceil((bh // P.p) / P.r), math.ceil((bw // P.p) / P.r)


def fit(h, w, P):
    q = h / w
    mw = math.sqrt((P.max_tokens - 2) / q + 0.25) - 0.5
    mh = mw * q
    cell = P.p * P.r
    if mw < 1.0:
        return (P.max_tokens - 2) // 2 * cell, cell
    if mh < 1.0:
        return cell, (P.max_tokens - 3) * cell
    beta = min(math.floor(mw) * cell / w, math.floor(mh) * cell / h)
    return math.floor(h * beta / P.p) * P.p, math.floor(w * beta / P.p) * P.p


def plan(w, h, P):
    if P.max_wh_ratio is not None and w > h * P.max_wh_ratio:
        w = h * P.max_wh_ratio
    if 0 < w * h < P.min_pixels:
        k = (P.min_pixels / (w * h)) ** 0.5
        w, h = int(w * k), int(h * k)
    bw, bh = math.ceil(w / P.p) * P.p, math.ceil(h / P.p) * P.p
    nh, nw = grid(bh, bw, P)
    if tokens(nh, nw) > P.max_tokens:
        bh, bw = fit(h, w, P)
        nh, nw = grid(bh, bw, P)
    return nh, nw, bh, bw


def oracle(path, P):
    with Image.open(path) as src:
        im = src.convert("RGB")
    nh, nw, bh, bw = plan(im.width, im.height, P)
    if P.max_wh_ratio is not None and im.width >= P.max_wh_ratio * im.height:
        im = im.resize((bw, bh))
    else:
        im = ImageOps.pad(im, (bw, bh), color=(127, 127, 127))
    x = torch.from_numpy(np.asarray(im, dtype=np.float32)).permute(2, 0, 1) / 255
    x = ((x - 0.5) / 0.5).to(torch.bfloat16)
    return x.contiguous().view(torch.int16).numpy().astype("<i2").tobytes(), dict(
        n_llm_h=nh, n_llm_w=nw, padded_height=bh, padded_width=bw, tokens=tokens(nh, nw))


def run_ds41(args):
    return subprocess.run([DS41, "image", "--json"] + args, capture_output=True, text=True)


def loaded_libjpeg():
    """The libjpeg file this process (Pillow) and the ds41 binary load."""
    b = io.BytesIO()
    Image.new("RGB", (8, 8)).save(b, "JPEG")  # makes Pillow load its JPEG library
    Image.open(io.BytesIO(b.getvalue())).load()
    mine = {os.path.realpath(line.split()[-1]) for line in open("/proc/self/maps") if "libjpeg" in line}
    out = subprocess.run(["ldd", DS41], capture_output=True, text=True).stdout
    theirs = {os.path.realpath(line.split("=>")[1].split()[0]) for line in out.splitlines()
              if "libjpeg" in line and "=>" in line}
    return mine, theirs


def compare(tmp, files, P, extra, tag, jpeg_direct):
    for path in files:
        name = f"{tag}:{os.path.basename(path)}"
        src = path
        if path.endswith(".jpg") and not jpeg_direct:  # compare after decode (see the docstring)
            src = os.path.join(tmp, os.path.basename(path) + ".decoded.png")
            Image.open(path).convert("RGB").save(src)
        want, want_plan = oracle(src, P)
        dump = os.path.join(tmp, "pixels.bf16")
        if os.path.exists(dump):
            os.unlink(dump)
        r = run_ds41(extra + ["--dump-pixels", dump, src])
        if r.returncode != 0:
            case(name, False, f"exit {r.returncode}: {r.stderr.strip()}")
            continue
        got_plan = json.loads(r.stdout)
        bad = {k: (got_plan.get(k), v) for k, v in want_plan.items() if got_plan.get(k) != v}
        if bad:
            case(name, False, f"plan (ds41, oracle): {bad}")
            continue
        got = open(dump, "rb").read()
        if got != want:
            a = np.frombuffer(got, dtype="<u2")
            b = np.frombuffer(want, dtype="<u2")
            if a.size != b.size:
                case(name, False, f"{a.size} values, oracle {b.size}")
                continue
            i = int(np.flatnonzero(a != b)[0])
            case(name, False, f"{int((a != b).sum())} of {a.size} BF16 values differ; first at {i}: "
                              f"{a[i]:#06x} vs {b[i]:#06x}")
            continue
        case(name, True)


def variant_config(tmp):
    """tests/configs/tiny with a small token budget, no min_pixels and max_wh_ratio 8."""
    cfg = json.load(open(os.path.join(ROOT, "tests", "configs", "tiny", "config.json")))
    cfg["vision_config"].update(max_image_tokens=64, min_pixels=0, max_wh_ratio=8)
    path = os.path.join(tmp, "variant.json")
    json.dump(cfg, open(path, "w"))
    return path


def main():
    with tempfile.TemporaryDirectory() as tmp:
        files = corpus(tmp)
        mine, theirs = loaded_libjpeg()
        same = bool(mine) and mine == theirs
        case("jpeg_same_library", bool(mine) and bool(theirs), f"Pillow loads {mine}, ds41 links {theirs}")
        if not same:
            print(f"note: Pillow's libjpeg {mine} is not ds41's {theirs}: JPEG cases compare after decoding")
        # the release parameters: from the tiny test config (its vision_config) and without -m
        compare(tmp, files, Params(), ["-m", os.path.join(ROOT, "tests", "configs", "tiny")], "release", same)
        rng = np.random.default_rng(5)
        extra = []
        for w, h in [(1000, 100), (800, 100), (801, 100), (300, 200), (5, 5), (1, 1), (100, 900), (3000, 20)]:
            path = os.path.join(tmp, f"variant_{w}x{h}.png")
            Image.fromarray(picture(rng, w, h)).save(path)
            extra.append(path)
        compare(tmp, extra + [f for f in files if "palette4" in f or "progressive" in f],
                Params(max_tokens=64, min_pixels=0, max_wh_ratio=8), ["-m", variant_config(tmp)], "variant", same)
        r = subprocess.run([DS41, "image", "--json", files[0]], capture_output=True, text=True)
        case("defaults_without_model", r.returncode == 0 and json.loads(r.stdout)["tokens"] == tokens(*plan(1, 1, Params())[:2]),
             r.stderr)
    sys.exit(1 if checks.failed else 0)


if __name__ == "__main__":
    main()
