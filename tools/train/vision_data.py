#!/usr/bin/env python3
"""Generated scenes for the demo model's vision tower: coloured shapes on a 3 x 3 grid, drawn
with Pillow, with chat questions about them and their answers.

A scene is a 126 x 126 RGB image (9 x 9 patches of 14 pixels; the 3 x 3 unshuffle makes it 3 x 3
image tokens, one per grid cell: 42 x 42 pixels = 3 x 3 patches). It holds 1 to 4 shapes
(circle, square, triangle) in distinct cells, each of one of five colours, of a random size
and offset inside its cell, on a light background with a little noise. The questions:

    What colour is the circle?      -> red          (asked when exactly one circle is there)
    How many squares are there?     -> 2            (0 to 4)
    Where is the triangle?          -> top left     (when exactly one; the 3 x 3 cell names)
    What is in the image?           -> a red circle (one-shape scenes)

    python3 tools/train/vision_data.py --seed 7 --out DIR -n 5   # writes DIR/NNN.png + qa.jsonl

Everything is drawn from a random.Random(seed): the same seed gives the same scenes and bytes."""

import argparse
import json
import os
import random

from PIL import Image, ImageDraw

SIZE = 126
CELL = SIZE // 3
SHAPES = ("circle", "square", "triangle")
PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles"}
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220),
           "yellow": (235, 205, 20), "purple": (140, 40, 170)}
CELLS = ("top left", "top", "top right", "left", "center", "right", "bottom left", "bottom", "bottom right")
KINDS = ("colour", "count", "where")


def jitter(rgb, rng, d=18):
    return tuple(max(0, min(255, c + rng.randint(-d, d))) for c in rgb)


def scene(rng, n_max=4):
    """-> list of (shape, colour, cell index, size, dx, dy): 1 to n_max shapes."""
    n = rng.randint(1, n_max)
    cells = rng.sample(range(9), n)
    objs = []
    for c in cells:
        s = rng.randint(20, 36)
        m = CELL - s
        objs.append((rng.choice(SHAPES), rng.choice(sorted(COLOURS)), c, s, rng.randint(0, m), rng.randint(0, m)))
    return objs


def draw(objs, rng):
    bg = tuple(rng.randint(225, 255) for _ in range(3))
    im = Image.new("RGB", (SIZE, SIZE), bg)
    d = ImageDraw.Draw(im)
    for shape, colour, cell, s, dx, dy in objs:
        x0, y0 = (cell % 3) * CELL + dx, (cell // 3) * CELL + dy
        fill = jitter(COLOURS[colour], rng)
        if shape == "circle":
            d.ellipse((x0, y0, x0 + s - 1, y0 + s - 1), fill=fill)
        elif shape == "square":
            d.rectangle((x0, y0, x0 + s - 1, y0 + s - 1), fill=fill)
        else:
            d.polygon(((x0 + s // 2, y0), (x0, y0 + s - 1), (x0 + s - 1, y0 + s - 1)), fill=fill)
    return im


def questions(objs):
    """Every (kind, question, answer) the scene answers unambiguously."""
    out = []
    for shape in SHAPES:
        mine = [o for o in objs if o[0] == shape]
        out.append(("count", "How many %s are there?" % PLURAL[shape], str(len(mine))))
        if len(mine) == 1:
            out.append(("colour", "What colour is the %s?" % shape, mine[0][1]))
            out.append(("where", "Where is the %s?" % shape, CELLS[mine[0][2]]))
    if len(objs) == 1:
        out.append(("caption", "What is in the image?", "a %s %s" % (objs[0][1], objs[0][0])))
    return out


def sample(rng, kind=None, n_max=4):
    """-> (PIL image, kind, question, answer, objects). kind None: a kind drawn evenly from KINDS (a caption
    one time in ten), then a scene of 1 to n_max shapes that has a question of that kind."""
    if kind is None:
        kind = "caption" if rng.random() < 0.1 else rng.choice(KINDS)
    while True:
        objs = scene(rng, n_max)
        qs = [q for q in questions(objs) if q[0] == kind]
        if kind == "count" and rng.random() < 0.85:
            qs = [q for q in qs if q[2] != "0"] or qs     # mostly shapes that are there
        if qs:
            k, q, a = rng.choice(qs)
            return draw(objs, rng), k, q, a, objs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds, in turn")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    kinds = a.kinds.split(",")
    with open(os.path.join(a.out, "qa.jsonl"), "w") as f:
        for i in range(a.n):
            im, k, q, ans, _ = sample(rng, kinds[i % len(kinds)])
            name = "%03d.png" % i
            im.save(os.path.join(a.out, name))
            f.write(json.dumps({"image": name, "kind": k, "question": q, "answer": ans}) + "\n")


if __name__ == "__main__":
    main()
