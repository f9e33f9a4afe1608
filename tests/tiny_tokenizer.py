#!/usr/bin/python3
"""Writes a small byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json) whose ids fit
the tiny test checkpoints' vocabulary of 512, so that the text commands (ds41 perplexity, chat)
can be tested on tests/configs/tiny:

  /usr/bin/python3 tests/tiny_tokenizer.py OUT_DIR [--vocab 512]

Layout as the demo model's tokenizer (tools/train/bpe.py): the special / added tokens the V4.1
chat template renders at ids 0..17 (BOS 0, EOS 1 as in the tiny config), the 256 byte symbols
next, then merges learnt from the short English text below (most frequent adjacent pair, ties
to the smaller pair) until the vocabulary is full. Pre-tokenizer: DeepSeek V3's Sequence (the
same regexes as tools/train/bpe.py), ByteLevel decoder, BOS added by the post-processor.
Deterministic: the same file every time."""
import json
import os
import re
import sys

SPECIALS = [
    ("<｜begin▁of▁sentence｜>", True), ("<｜end▁of▁sentence｜>", True), ("<｜▁pad▁｜>", True),
    ("<｜User｜>", False), ("<｜Assistant｜>", False), ("<｜System｜>", False),
    ("<｜latest_reminder｜>", False), ("<think>", False), ("</think>", False), ("｜DSML｜", False),
    ("<｜action｜>", False), ("<｜query｜>", False), ("<｜authority｜>", False), ("<｜domain｜>", False),
    ("<｜title｜>", False), ("<｜read_url｜>", False), ("<｜deepseek_image｜>", False), ("<｜noise｜>", True),
]

PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[一-龥\u3040-ゟ゠-ヿ]+"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex":
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
            " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ],
}

TEXT = """\
The quick brown fox jumps over the lazy dog. A small model reads the text one token at a time
and guesses the next one; the better the guess, the lower the perplexity. In the beginning the
weights are random, so every guess is as good as any other, and the model says nothing that
makes sense. What does the word window mean? A window is an opening in a wall that lets in the
light and the air. Tell me a fortune: you will find what you are looking for, once you stop
looking for it. The sun rises in the east and sets in the west; the moon follows the sun across
the sky. There is a time to speak and a time to be silent, a time to read and a time to write.
Numbers such as 12, 345 and 2026 are split into groups of at most three digits.
"""

MAIN = re.compile(r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\S\r\n]?[^\W\d_]+| ?[^\w\s]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+|\d{1,3}|\w""")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    out, vocab_size = args[0], 512
    if "--vocab" in args:
        vocab_size = int(args[args.index("--vocab") + 1])
    words = {}
    for w in MAIN.findall(TEXT):
        b = tuple(w.encode("utf-8"))
        words[b] = words.get(b, 0) + 1
    sym = [bytes([b]) for b in range(256)]
    seqs = [[list(w), c] for w, c in sorted(words.items())]
    merges = []
    n_merges = vocab_size - len(SPECIALS) - 256
    while len(merges) < n_merges:
        counts = {}
        for s, c in seqs:
            for p in zip(s, s[1:]):
                counts[p] = counts.get(p, 0) + c
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        new = len(sym)
        sym.append(sym[best[0]] + sym[best[1]])
        merges.append(best)
        for e in seqs:
            s, r, i = e[0], [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    r.append(new)
                    i += 2
                else:
                    r.append(s[i])
                    i += 1
            e[0] = r
    b2u = bytes_to_unicode()

    def name(sid):
        return "".join(b2u[x] for x in sym[sid])
    vocab = {c: i for i, (c, _) in enumerate(SPECIALS)}
    for sid in range(len(sym)):
        vocab[name(sid)] = len(SPECIALS) + sid
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": sp} for i, (c, sp) in enumerate(SPECIALS)]
    bos = SPECIALS[0][0]
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZER,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [0], "tokens": [bos]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": ["%s %s" % (name(a), name(b)) for a, b in merges]},
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")

    def at(c):
        return {"__type": "AddedToken", "content": c, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False}
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": at(SPECIALS[0][0]),
           "eos_token": at(SPECIALS[1][0]), "pad_token": at(SPECIALS[2][0]), "unk_token": None,
           "clean_up_tokenization_spaces": False, "legacy": True, "model_max_length": 4096,
           "tokenizer_class": "LlamaTokenizerFast"}
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
