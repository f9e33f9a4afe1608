"""Writes a small byte-level BPE tokenizer.json (Hugging Face format) for the serve tests:
the V4.1 special / added tokens first (ids 0..), the 256 byte tokens, then BPE merges learned
from a small text until the vocabulary has VOCAB entries (default 500, under the tiny
checkpoint's 512). The pre-tokenizer and decoder are DeepSeek's (as in models/demo).
usage: make_tokenizer.py OUT_DIR [VOCAB]"""
import json, os, re, sys
from collections import Counter

out = sys.argv[1]
V = int(sys.argv[2]) if len(sys.argv) > 2 else 500
specials = [("<｜begin▁of▁sentence｜>", True), ("<｜end▁of▁sentence｜>", True), ("<｜▁pad▁｜>", True),
            ("<｜User｜>", False), ("<｜Assistant｜>", False), ("<｜System｜>", False),
            ("<｜latest_reminder｜>", False), ("<think>", False), ("</think>", False), ("｜DSML｜", False),
            ("<｜action｜>", False), ("<tool_result>", False), ("</tool_result>", False)]

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return dict(zip(bs, map(chr, cs)))

b2u = bytes_to_unicode()
vocab = {}
for s, _ in specials:
    vocab[s] = len(vocab)
for b in range(256):
    vocab[b2u[b]] = len(vocab)
text = """You have access to a set of tools to help answer the user's question. You can invoke tools
by writing a block like the following. String parameters should be specified as is and set string true.
For all other types (numbers, arrays, objects) use JSON format. The weather in Paris is sunny today.
Hello world, this is ds41. What is the capital of France? The quick brown fox jumps over the lazy dog.
parameter name invoke calls function description properties required type object string location city
The user asked about the weather, so I should call the tool with the location and the unit celsius.
""" * 3
words = re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", text)
seqs = Counter(tuple(b2u[b] for b in w.encode()) for w in words)
merges = []
while len(vocab) < V:
    pairs = Counter()
    for s, c in seqs.items():
        for a, b in zip(s, s[1:]):
            pairs[(a, b)] += c
    if not pairs:
        break
    (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
    merges.append(a + " " + b)
    vocab[a + b] = len(vocab)
    new = Counter()
    for s, c in seqs.items():
        r, i = [], 0
        while i < len(s):
            if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                r.append(a + b); i += 2
            else:
                r.append(s[i]); i += 1
        new[tuple(r)] += c
    seqs = new
added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
          "special": sp} for i, (s, sp) in enumerate(specials)]
tok = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "<｜begin▁of▁sentence｜>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                       "pair": [{"SpecialToken": {"id": "<｜begin▁of▁sentence｜>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                {"SpecialToken": {"id": "<｜begin▁of▁sentence｜>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                       "special_tokens": {"<｜begin▁of▁sentence｜>": {"id": "<｜begin▁of▁sentence｜>", "ids": [0], "tokens": ["<｜begin▁of▁sentence｜>"]}}},
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
              "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": merges},
}
os.makedirs(out, exist_ok=True)
json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"), ensure_ascii=False)
cfg = {"add_bos_token": True, "add_eos_token": False,
       "bos_token": {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
       "eos_token": {"__type": "AddedToken", "content": "<｜end▁of▁sentence｜>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}}
json.dump(cfg, open(os.path.join(out, "tokenizer_config.json"), "w"), ensure_ascii=False)
