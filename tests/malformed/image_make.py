#!/usr/bin/env -S /usr/bin/python3
"""Writes the malformed-image corpus tests/malformed/image/: each NAME is a file ds41 must refuse,
NAME.expected the text its one-line message must contain. tests/test_image.c reads them.
Deterministic (Pillow's encoders at fixed settings, then byte surgery); rerun after a change:
    /usr/bin/python3 tests/malformed/image_make.py"""
import io
import os
import struct
import zlib

import numpy as np
from PIL import Image

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "image")


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(w, h, depth=8, color_type=2, rows=None, palette=None, idat=None):
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 0)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
    if palette is not None:
        out += chunk(b"PLTE", palette)
    if idat is None:
        idat = zlib.compress(rows)
    return out + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def pil_bytes(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def main():
    os.makedirs(OUT, exist_ok=True)
    for n in os.listdir(OUT):
        os.unlink(os.path.join(OUT, n))
    rng = np.random.default_rng(3)
    pic = Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8))
    good_png = pil_bytes(pic, "PNG")
    good_jpg = pil_bytes(pic, "JPEG", quality=80)
    cases = {}

    def add(name, data, expected):
        cases[name] = (data, expected)

    # PNG
    add("png-truncated-in-idat.png", good_png[: len(good_png) // 2], "truncated")
    add("png-no-iend.png", good_png[:-12], "truncated")
    add("png-signature-only.png", good_png[:8], "truncated")
    bad = bytearray(good_png)
    bad[29] ^= 0xFF  # IHDR CRC
    add("png-ihdr-crc.png", bytes(bad), "CRC error")
    i = good_png.index(b"IDAT")
    bad = bytearray(good_png)
    bad[i + 4 : i + 6] = b"\x00\x00"  # zlib header of the image data
    add("png-idat-zlib-header.png", bytes(bad), "PNG:")
    add("png-bomb-side.png", png(100000, 1, rows=b"\0" * 2), "beyond")
    add("png-bomb-pixels.png", png(16000, 16000, depth=1, color_type=0, rows=b"\0" * 2001), "decompression bomb")
    add("png-zero-width.png", png(0, 5, rows=b""), "width is zero")
    add("png-bad-depth.png", png(4, 4, depth=4, color_type=2, rows=b"\0" * 40), "bit depth combination")
    add("png-bad-color-type.png", png(4, 4, depth=8, color_type=5, rows=b"\0" * 40), "Invalid color type")
    add("png-palette-missing-plte.png", png(4, 4, depth=8, color_type=3, rows=b"\0" * 20), "PLTE")
    add("png-palette-index-beyond.png",
        png(4, 1, depth=8, color_type=3, rows=b"\0\x00\x01\x02\x09", palette=bytes(range(9))), "palette index 9")
    add("png-idat-short.png", png(64, 64, rows=b"\0" * 100), "PNG:")
    # JPEG
    add("jpeg-truncated.jpg", good_jpg[: len(good_jpg) * 2 // 3], "truncated")
    add("jpeg-soi-only.jpg", good_jpg[:4], "JPEG:")
    sof = good_jpg.index(b"\xff\xc0")
    bad = bytearray(good_jpg)
    bad[sof + 5 : sof + 9] = struct.pack(">HH", 60000, 60000)  # height, width
    add("jpeg-bomb.jpg", bytes(bad), "beyond the limit")
    bad = bytearray(good_jpg)
    bad[sof + 5 : sof + 9] = struct.pack(">HH", 0, 32)
    add("jpeg-zero-height.jpg", bytes(bad), "JPEG:")
    sos = good_jpg.index(b"\xff\xda")
    bad = bytearray(good_jpg)
    bad[sos + 20 : sos + 60] = b"\xff\xd9" * 20  # an EOI in the middle of the entropy data
    add("jpeg-corrupt-scan.jpg", bytes(bad), "corrupt or truncated")
    bad = bytearray(good_jpg)
    bad[sof + 2 : sof + 4] = b"\x00\x01"  # SOF length 1
    add("jpeg-bogus-marker-length.jpg", bytes(bad), "JPEG:")
    # other formats and junk
    add("gif.gif", pil_bytes(pic, "GIF"), "unsupported image format GIF")
    add("bmp.bmp", pil_bytes(pic, "BMP"), "unsupported image format BMP")
    add("webp-header.webp", b"RIFF\x24\0\0\0WEBPVP8 " + b"\0" * 24, "unsupported image format WebP")
    add("tiff-header.tif", b"II*\0\x08\0\0\0" + b"\0" * 16, "unsupported image format TIFF")
    add("empty", b"", "empty image data")
    add("text.txt", b"hello, this is not an image\n", "unknown image format")
    for name, (data, expected) in sorted(cases.items()):
        open(os.path.join(OUT, name), "wb").write(data)
        open(os.path.join(OUT, name + ".expected"), "w").write(expected + "\n")
    print(f"{len(cases)} cases in {OUT}")


if __name__ == "__main__":
    main()
