#!/usr/bin/python3
"""Trains the demo model's byte-level BPE on the training split and writes a Hugging Face
tokenizer.json + tokenizer_config.json in the layout of DeepSeek's own file.

  /usr/bin/python3 tools/train/bpe.py [--data build/demo-data/train.jsonl] [--out models/demo]
                                      [--vocab 4096]

Vocabulary: `--vocab` ids in all: the special/added tokens at ids 0..N-1 (see SPECIALS), the
256 byte symbols next, then one id per merge. Pre-tokenizer: DeepSeek V3's Sequence (digits in
groups of 1-3, CJK runs, the letters/punctuation/whitespace regex, ByteLevel without prefix
space and without its own regex); no \\h or \\b anywhere (ds41 refuses them). Training counts
pre-tokenized chunks with a Python approximation of that regex (Python's `re` has no \\p{..};
the corpus is English, and the approximation only steers which merges are learnt: encoding
always follows tokenizer.json). Merges: the most frequent adjacent pair, ties broken by the
smaller pair (in id order), counts kept incrementally (pair -> count, pair -> words holding it).
"""
import argparse
import collections
import heapq
import json
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (content, special). Ids are the positions. special=True: a control token (skipped by
# decode(skip_special_tokens), not matched with --no-special); False: an added token matched
# in text but kept in decoded output, as DeepSeek's file has <｜User｜>, <｜Assistant｜>,
# <think>, </think> and the tool tokens.
SPECIALS = [
    ("<｜begin▁of▁sentence｜>", True),   # 0 BOS
    ("<｜end▁of▁sentence｜>", True),     # 1 EOS
    ("<｜▁pad▁｜>", True),               # 2 pad (engram_pad_token_id)
    ("<｜User｜>", False),               # 3
    ("<｜Assistant｜>", False),          # 4
    ("<｜System｜>", False),             # 5
    ("<｜latest_reminder｜>", False),    # 6
    ("<think>", False),                  # 7
    ("</think>", False),                 # 8
    ("｜DSML｜", False),                 # 9  inside "<｜DSML｜ calls>" etc.
    ("<｜action｜>", False),             # 10
    ("<｜query｜>", False),              # 11
    ("<｜authority｜>", False),          # 12
    ("<｜domain｜>", False),             # 13
    ("<｜title｜>", False),              # 14
    ("<｜read_url｜>", False),           # 15
    ("<｜deepseek_image｜>", False),     # 16
    ("<｜noise｜>", True),               # 17 DSpark noise token
]

PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[一-龥\u3040-ゟ゠-ヿ]+"}, "behavior": "Isolated",
         "invert": False},
        {"type": "Split", "pattern": {"Regex":
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
            " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ],
}

# Python approximation of the regexes above, applied in the same order.
DIGITS = re.compile(r"\d{1,3}")
MAIN = re.compile(
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"""
    r"|[^\S\r\n]?[^\W\d_]+"
    r"| ?[^\w\s]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    r"|\w")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def chunks(text, specials_re):
    for piece in specials_re.split(text):
        if not piece:
            continue
        pos = 0
        for m in DIGITS.finditer(piece):
            if m.start() > pos:
                yield from MAIN.findall(piece, pos, m.start())
            yield m.group(0)
            pos = m.end()
        if pos < len(piece):
            yield from MAIN.findall(piece, pos)


def train(counts, n_merges, log=sys.stderr):
    """counts: {bytes: count}. Returns the merges as (a, b) pairs of symbol ids (0..255 bytes,
    256+k the k-th merge) and the symbol byte strings."""
    sym = [bytes([b]) for b in range(256)]
    words = []
    freqs = []
    for w, c in counts.items():
        words.append(list(w))
        freqs.append(c)
    pair_count = collections.defaultdict(int)
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        f = freqs[i]
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += f
            where[(a, b)].add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    t0 = time.time()
    while len(merges) < n_merges and heap:
        c, p = heapq.heappop(heap)
        if pair_count.get(p, 0) != -c or c == 0:
            continue  # stale entry
        new = len(sym)
        a, b = p
        sym.append(sym[a] + sym[b])
        merges.append(p)
        touched = {}
        for i in list(where[p]):
            w = words[i]
            f = freqs[i]
            # remove the old pairs of this word, rebuild it, add the new pairs
            for x, y in zip(w, w[1:]):
                pair_count[(x, y)] -= f
                touched[(x, y)] = 1
            out = []
            k = 0
            n = len(w)
            while k < n:
                if k + 1 < n and w[k] == a and w[k + 1] == b:
                    out.append(new)
                    k += 2
                else:
                    out.append(w[k])
                    k += 1
            for x, y in zip(w, w[1:]):
                where[(x, y)].discard(i)
            words[i] = out
            for x, y in zip(out, out[1:]):
                pair_count[(x, y)] += f
                where[(x, y)].add(i)
                touched[(x, y)] = 1
        del where[p]
        pair_count.pop(p, None)
        for q in touched:
            cq = pair_count.get(q, 0)
            if cq > 0:
                heapq.heappush(heap, (-cq, q))
            elif q in pair_count:
                del pair_count[q]
        if len(merges) % 500 == 0:
            print("bpe: %d merges, %.1f s, last %r x%d" % (len(merges), time.time() - t0, sym[new], -c),
                  file=log)
    return merges, sym


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(ROOT, "build/demo-data/train.jsonl"))
    ap.add_argument("--out", default=os.path.join(ROOT, "models/demo"))
    ap.add_argument("--vocab", type=int, default=4096)
    a = ap.parse_args()
    t0 = time.time()
    specials_re = re.compile("|".join(re.escape(s) for s, _ in SPECIALS))
    counts = collections.Counter()
    nbytes = 0
    with open(a.data, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            nbytes += len(text.encode())
            counts.update(chunks(text, specials_re))
    bcounts = collections.Counter()
    for w, c in counts.items():
        bcounts[w.encode("utf-8")] += c
    print("bpe: %d bytes, %d distinct chunks, %.1f s" % (nbytes, len(bcounts), time.time() - t0),
          file=sys.stderr)
    n_merges = a.vocab - len(SPECIALS) - 256
    merges, sym = train(bcounts, n_merges)
    print("bpe: %d merges in %.1f s total" % (len(merges), time.time() - t0), file=sys.stderr)

    b2u = bytes_to_unicode()
    def s(sid):
        return "".join(b2u[x] for x in sym[sid])
    base = len(SPECIALS)
    vocab = {}
    for i, (c, _) in enumerate(SPECIALS):
        vocab[c] = i
    for sid in range(len(sym)):
        vocab[s(sid)] = base + sid
    assert len(vocab) == a.vocab, len(vocab)
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": sp} for i, (c, sp) in enumerate(SPECIALS)]
    bos = SPECIALS[0][0]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZER,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [0], "tokens": [bos]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": ["%s %s" % (s(x), s(y)) for x, y in merges],
        },
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    def at(c):
        return {"__type": "AddedToken", "content": c, "lstrip": False, "normalized": False,
                "rstrip": False, "single_word": False}
    cfg = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": at(SPECIALS[0][0]),
        "eos_token": at(SPECIALS[1][0]),
        "pad_token": at(SPECIALS[2][0]),
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": 4096,
        "tokenizer_class": "LlamaTokenizerFast",
        "added_tokens_decoder": {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added},
    }
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("bpe: wrote %s/tokenizer.json (%d ids) in %.1f s" % (a.out, a.vocab, time.time() - t0),
          file=sys.stderr)


if __name__ == "__main__":
    main()
