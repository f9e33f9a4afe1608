#!/usr/bin/python3
"""Builds the demo model's corpus from Debian-packaged public English text.

  /usr/bin/python3 tools/train/corpus.py build      [--out build/demo-data]
  /usr/bin/python3 tools/train/corpus.py tokenize   [--out build/demo-data] [-m models/demo]
  /usr/bin/python3 tools/train/corpus.py heldout    [--out DIR]   # held-out split only
  /usr/bin/python3 tools/train/corpus.py check-template [-n 300] [--out DIR]
                                         # heldout_chat.jsonl vs `ds41 chat-template` ($DS41)

Sources (Debian 12 packages): bible-kjv-text (read with bible-kjv's `bible`), fortunes +
fortunes-min (not the offensive `off/` files), jargon-text, dict-gcide. Every document is a
plain UTF-8 string. Chat documents are some of those documents rendered in the DeepSeek V4.1
chat format exactly as ds41's src/text/chat.c renders a finished exchange in chat mode (thinking
off):

  <｜begin▁of▁sentence｜><｜User｜>QUESTION<｜Assistant｜></think>ANSWER<｜end▁of▁sentence｜>

i.e. the prompt `ds41 chat-template` prints for [user] with add_generation_prompt, followed by
what the model must generate. `check-template` verifies the Python renderer against
`./ds41 chat-template --text` byte for byte.

Split: a document is held out when sha256("ds41-demo-split:" + source + ":" + key) mod 1000
< 20 (2 %, whole documents, independent of the order and of the other documents); a chat
document is held out exactly when the document it was made from is.

Outputs (in --out):
  train.jsonl / heldout.jsonl / heldout_chat.jsonl   {"src","key","kind","text"} one a line
  heldout_pd.jsonl                the KJV and Jargon File part of both held-out files
  train.txt, heldout.txt (plain), heldout_chat.txt (chat): texts joined by "\\n\\n"
  train.bin / heldout.bin / heldout_chat.bin   uint16 LE ids; plain document = [BOS] ids [EOS],
                                 chat document = ids of its rendered text (it carries BOS and EOS)
  train.idx / ...                 uint64 LE start offset (in tokens) of each document + total
  summary.json
"""
import argparse
import gzip
import hashlib
import json
import os
import random
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
END_THINK = "</think>"

HELDOUT_PER_MILLE = 20
SEED = 41
GCIDE_MAX_BYTES = 14_000_000     # plain GCIDE text kept (deterministic sample of headwords)
CHAT_ANSWER_MAX = 1200           # chat answers are cut at a paragraph boundary below this

KJV_BOOKS = [
    ("Ge", "Genesis"), ("Exo", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"),
    ("Deu", "Deuteronomy"), ("Josh", "Joshua"), ("Jdgs", "Judges"), ("Ruth", "Ruth"),
    ("1Sm", "1 Samuel"), ("2Sm", "2 Samuel"), ("1Ki", "1 Kings"), ("2Ki", "2 Kings"),
    ("1Chr", "1 Chronicles"), ("2Chr", "2 Chronicles"), ("Ezra", "Ezra"), ("Neh", "Nehemiah"),
    ("Est", "Esther"), ("Job", "Job"), ("Psa", "Psalms"), ("Prv", "Proverbs"),
    ("Eccl", "Ecclesiastes"), ("SSol", "Song of Solomon"), ("Isa", "Isaiah"),
    ("Jer", "Jeremiah"), ("Lam", "Lamentations"), ("Eze", "Ezekiel"), ("Dan", "Daniel"),
    ("Hos", "Hosea"), ("Joel", "Joel"), ("Amos", "Amos"), ("Obad", "Obadiah"),
    ("Jonah", "Jonah"), ("Mic", "Micah"), ("Nahum", "Nahum"), ("Hab", "Habakkuk"),
    ("Zep", "Zephaniah"), ("Hag", "Haggai"), ("Zec", "Zechariah"), ("Mal", "Malachi"),
    ("Mat", "Matthew"), ("Mark", "Mark"), ("Luke", "Luke"), ("John", "John"), ("Acts", "Acts"),
    ("Rom", "Romans"), ("1Cor", "1 Corinthians"), ("2Cor", "2 Corinthians"),
    ("Gal", "Galatians"), ("Eph", "Ephesians"), ("Phi", "Philippians"), ("Col", "Colossians"),
    ("1Th", "1 Thessalonians"), ("2Th", "2 Thessalonians"), ("1Tim", "1 Timothy"),
    ("2Tim", "2 Timothy"), ("Titus", "Titus"), ("Phmn", "Philemon"), ("Heb", "Hebrews"),
    ("Jas", "James"), ("1Pet", "1 Peter"), ("2Pet", "2 Peter"), ("1Jn", "1 John"),
    ("2Jn", "2 John"), ("3Jn", "3 John"), ("Jude", "Jude"), ("Rev", "Revelation"),
]


def held_out(src, key):
    h = hashlib.sha256(("ds41-demo-split:%s:%s" % (src, key)).encode()).digest()
    return int.from_bytes(h[:8], "little") % 1000 < HELDOUT_PER_MILLE


def render_chat(user, answer):
    """src/text/chat.c, chat mode, [user, assistant] without generation prompt == the prompt
    for [user] with add_generation_prompt followed by answer + EOS."""
    return BOS + USER + user + ASSISTANT + END_THINK + answer + EOS


def chat_prompt(user):
    return BOS + USER + user + ASSISTANT + END_THINK


def tidy(text):
    """Strips trailing spaces, collapses 3+ newlines, strips the ends."""
    text = "\n".join(l.rstrip() for l in text.replace("\r\n", "\n").replace("\t", "    ").split("\n"))
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n")


def clean_specials(text):
    # the corpus must not contain the tokenizer's special-token strings as text
    for s in ("<｜", "｜>", "<think>", "</think>", "｜DSML｜"):
        text = text.replace(s, "")
    return text


def cut_answer(text, limit=CHAT_ANSWER_MAX):
    if len(text) <= limit:
        return text
    paras = text.split("\n\n")
    out = paras[0]
    for p in paras[1:]:
        if len(out) + 2 + len(p) > limit:
            break
        out += "\n\n" + p
    if len(out) > limit:  # one long paragraph: cut at a sentence end
        cut = out[:limit]
        k = max(cut.rfind(". "), cut.rfind(".\n"))
        out = cut[:k + 1] if k > limit // 3 else cut.rsplit(" ", 1)[0]
    return out


# ---------------------------------------------------------------- sources

def kjv():
    out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, check=True,
                         env=dict(os.environ, COLUMNS="100000")).stdout.decode("utf-8")
    names = dict(KJV_BOOKS)
    chapters = {}
    order = []
    for line in out.split("\n"):
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if not m:
            if line.strip():
                raise SystemExit("corpus: unexpected bible output line: %r" % line[:80])
            continue
        book, ch, vs, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4).strip()
        k = (book, ch)
        if k not in chapters:
            chapters[k] = []
            order.append(k)
        chapters[k].append((vs, text))
    if len(chapters) != 1189:
        raise SystemExit("corpus: KJV has %d chapters, expected 1189" % len(chapters))
    docs = []
    for book, ch in order:
        name = names[book]
        verses = chapters[(book, ch)]
        body = "\n".join("%d:%d %s" % (ch, v, t) for v, t in verses)
        key = "%s %d" % (name, ch)
        docs.append(dict(src="kjv", key=key, text="%s %d\n\n%s" % (name, ch, body),
                         verses=[(name, ch, v, t) for v, t in verses]))
    return docs


FORTUNE_DIR = "/usr/share/games/fortunes"


def fortunes():
    docs = []
    seen = set()
    for name in sorted(os.listdir(FORTUNE_DIR)):
        p = os.path.join(FORTUNE_DIR, name)
        if "." in name or not os.path.isfile(p) or name == "off":
            continue
        raw = open(p, "rb").read()
        try:
            data = raw.decode("utf-8")
        except UnicodeDecodeError:
            data = raw.decode("latin-1")
        for i, f in enumerate(re.split(r"\n%\n", "\n" + data + "\n")):
            t = tidy(f.strip("%\n"))
            if len(t) < 8 or t in seen:
                continue
            seen.add(t)
            docs.append(dict(src="fortunes", key="%s/%d" % (name, i), text=t))
    return docs


def reflow(block):
    """Joins the wrapped lines of each paragraph; keeps indented/short lines as they are
    when the paragraph looks like verse or a table."""
    out = []
    for para in re.split(r"\n\s*\n", block):
        lines = [l.strip() for l in para.split("\n") if l.strip()]
        if not lines:
            continue
        if any(c in para for c in "│┌└├") or (len(lines) > 1 and max(len(l) for l in lines) < 40):
            out.append("\n".join(lines))
        else:
            out.append(" ".join(lines))
    return "\n\n".join(out)


def jargon():
    text = gzip.open("/usr/share/doc/jargon-text/jargon.txt.gz").read().decode("utf-8")
    start = text.index("\n   :(TM):")
    end = text.find("\n", text.index("\n   :zorkmid:") + 1)
    end = text.find("\n   Appendix", end)
    lex = text[start:end if end > 0 else len(text)]
    docs = []
    parts = re.split(r"\n   :([^\n:][^\n]*?):(?=[ \n])", lex)
    for i in range(1, len(parts), 2):
        word = parts[i].strip()
        rest = parts[i + 1]
        first, _, body = rest.partition("\n")
        gram = first.strip()  # pronunciation / part of speech, e.g. "/god·zil'@·gram/, n."
        body = reflow(body)
        body = re.sub(r"\{([^{}]*)\}", r"\1", body)
        if not body or len(body) < 10:
            continue
        head = word + (" " + gram if gram else "")
        docs.append(dict(src="jargon", key=word, text=tidy(head + "\n\n" + body),
                         word=word, answer=tidy(body)))
    return docs


B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def b64num(s):
    v = 0
    for c in s:
        v = v * 64 + B64.index(c)
    return v


ACCENT = {"ae": "ae", "AE": "AE", "oe": "oe", "OE": "OE", "root": "root", "deg": "°",
          "frac12": "1/2", "frac14": "1/4", "frac34": "3/4", "frac13": "1/3", "frac23": "2/3",
          "sect": "§", "pound": "£", "cced": "ç", "ntil": "ñ", "eacute": "é", "egrave": "è",
          "ccedil": "ç", "sharp": "#", "flat": "b", "prime": "'", "dprime": "\"",
          "times": "x", "divide": "/", "middot": "·", "para": "¶", "cent": "¢"}


def gcide_plain(entry):
    t = entry.replace("\r", "")
    lines = t.split("\n")
    # headword line(s): "Word \Pro"nun\ (pron), pos. [etymology]"
    t = "\n".join(lines)
    t = re.sub(r"\\[^\\\n]*\\", "", t)                       # \hack"er\ pronunciation
    t = re.sub(r"\[(?:1913 Webster|Webster 1913 Suppl\.|WordNet[^\]]*|PJC|Century Dict\.|"
               r"Websters?[^\]]*|Chambers[^\]]*|[A-Z][a-z]+\.? ?Dict\.?[^\]]*|RHD|NRCD|DOE|"
               r"MW10|AS|FOLDOC|Mach\. Dict\.|Brande & C\.|Ure|Knight|Gray|Craig|Crabb|Encyc\.)\]",
               "", t)
    t = re.sub(r"\[([a-zA-Z]+)\]", lambda m: ACCENT.get(m.group(1), m.group(1)
               if len(m.group(1)) <= 2 else m.group(0)), t)
    t = re.sub(r"\[[=~^.'\"`,]?([a-zA-Z])[=~^.'\"`,]?\]", r"\1", t)
    t = re.sub(r"\[([a-zA-Z])(?:mac|acute|grave|cir|circ|uml|um|til|tilde|ced|ring|breve|dot|"
               r"sd|ddot|cr)\]", r"\1", t)
    t = re.sub(r"\{([^{}]*)\}", r"\1", t)
    t = t.replace("\"", "\"")
    head, _, body = t.partition("\n")
    # the pronunciation in parentheses and the etymology in brackets right after the word
    head = re.sub(r"\s*\([^)]*\)", "", head, count=1) if "(" in head[:80] else head
    body = body
    text = head.strip() + "\n" + body
    # drop a leading etymology block "[OE. ...]" that may span lines
    m = re.match(r"([^\n\[]*?)(\s*\[(?:[^\[\]]|\[[^\[\]]*\])*\])", text, re.S)
    if m and len(m.group(2)) < 1500 and m.start(2) < 200:
        text = text[:m.start(2)] + text[m.end(2):]
    out = []
    for para in re.split(r"\n\s*\n", text):
        ls = [l.strip() for l in para.split("\n") if l.strip()]
        if ls:
            out.append(" ".join(ls))
    s = "\n\n".join(out)
    s = re.sub(r" {2,}", " ", s)
    s = re.sub(r" ([,.;:])", r"\1", s)
    return s.strip()


def gcide():
    data = gzip.open("/usr/share/dictd/gcide.dict.dz").read()
    byword = {}
    order = []
    used = set()
    for line in open("/usr/share/dictd/gcide.index", encoding="utf-8"):
        p = line.rstrip("\n").split("\t")
        if len(p) != 3 or p[0].startswith("00-") or not re.match(r"^[A-Za-z][A-Za-z' -]*$", p[0]):
            continue
        span = (b64num(p[1]), b64num(p[2]))
        if span in used:
            continue
        # an index line can point at another headword's entry (a sub-entry): the document
        # belongs to the entry's own headword, and each entry is used once
        m = re.match(r"([^\\\n]+?) \\", data[span[0]:span[0] + 200].decode("utf-8", "replace"))
        if not m or m.group(1).strip().lower() != p[0].lower():
            continue
        used.add(span)
        w = p[0].lower()
        if w not in byword:
            byword[w] = []
            order.append(w)
        byword[w].append(span)
    rng = random.Random(SEED)
    order_s = order[:]
    rng.shuffle(order_s)
    docs = []
    total = 0
    for w in order_s:
        defs = []
        for off, n in byword[w]:
            e = data[off:off + n].decode("utf-8", "replace")
            s = gcide_plain(e)
            if s and s not in defs:
                defs.append(s)
        if not defs:
            continue
        text = "\n\n".join(defs)
        if len(text) < 20:
            continue
        word = re.match(r"[^,\n]*", text).group(0).strip() or w
        docs.append(dict(src="gcide", key=w, text=text, word=word, answer=text))
        total += len(text.encode()) + 2
        if total >= GCIDE_MAX_BYTES:
            break
    return docs


# ---------------------------------------------------------------- chat documents

def chat_docs(sources, rng):
    out = []
    for d in sources["gcide"]:
        if rng.random() < 0.18:
            out.append((d, "What does %s mean?" % d["word"], cut_answer(d["answer"])))
    for d in sources["jargon"]:
        if rng.random() < 0.60:
            q = rng.choice(["What does %s mean?", "What does \"%s\" mean in hacker jargon?"])
            out.append((d, q % d["word"], cut_answer(d["answer"])))
    for d in sources["fortunes"]:
        if rng.random() < 0.35:
            q = rng.choice(["Tell me a fortune.", "Tell me a fortune.", "Give me a fortune cookie.",
                            "Say something wise.", "Tell me a quote."])
            out.append((d, q, d["text"]))
    for d in sources["kjv"]:
        for name, ch, v, t in d["verses"]:
            if rng.random() < 0.12:
                out.append((d, "Quote %s %d:%d." % (name, ch, v), t))
        if rng.random() < 0.25:
            n = min(5, len(d["verses"]))
            q = "Quote the first verses of %s chapter %d." % (d["verses"][0][0], d["verses"][0][1])
            out.append((d, q, "\n".join("%d:%d %s" % (ch, v, t) for _, ch, v, t in d["verses"][:n])))
    docs = []
    for d, q, a in out:
        docs.append(dict(src=d["src"] + "-chat", key=d["key"], split_key=(d["src"], d["key"]),
                         text=render_chat(clean_specials(q), clean_specials(a)), kind="chat"))
    return docs


# ---------------------------------------------------------------- build

def write_jsonl(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"src": d["src"], "key": d["key"], "kind": d.get("kind", "plain"),
                                "text": d["text"]}, ensure_ascii=False) + "\n")


def write_txt(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join(d["text"] for d in docs) + "\n")


def build(out, heldout_only=False):
    os.makedirs(out, exist_ok=True)
    sources = {"kjv": kjv(), "fortunes": fortunes(), "jargon": jargon(), "gcide": gcide()}
    for docs in sources.values():
        for d in docs:
            d["text"] = clean_specials(d["text"])
            d["kind"] = "plain"
    rng = random.Random(SEED)
    chats = chat_docs(sources, rng)
    train, held, held_chat = [], [], []
    for src, docs in sources.items():
        for d in docs:
            (held if held_out(src, d["key"]) else train).append(d)
    for d in chats:
        (held_chat if held_out(*d["split_key"]) else train).append(d)
    random.Random(SEED + 1).shuffle(train)
    if not heldout_only:
        write_jsonl(os.path.join(out, "train.jsonl"), train)
        write_txt(os.path.join(out, "train.txt"), [d for d in train if d["kind"] == "plain"])
        write_txt(os.path.join(out, "train_chat.txt"), [d for d in train if d["kind"] == "chat"])
    # the public-domain part (KJV, Jargon File) of the held-out split, committed as
    # models/demo/heldout/heldout_pd.jsonl for the tokenizer test (GCIDE is GPL and fortunes
    # carry their authors' notices: those are regenerated from the packages instead)
    write_jsonl(os.path.join(out, "heldout_pd.jsonl"),
                [d for d in held + held_chat if d["src"].split("-")[0] in ("kjv", "jargon")])
    write_jsonl(os.path.join(out, "heldout.jsonl"), held)
    write_jsonl(os.path.join(out, "heldout_chat.jsonl"), held_chat)
    write_txt(os.path.join(out, "heldout.txt"), held)
    write_txt(os.path.join(out, "heldout_chat.txt"), held_chat)
    summ = {}
    for split, docs in (("train", train), ("heldout", held), ("heldout_chat", held_chat)):
        for d in docs:
            s = summ.setdefault(split, {}).setdefault(d["src"], {"docs": 0, "bytes": 0})
            s["docs"] += 1
            s["bytes"] += len(d["text"].encode())
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summ, f, indent=1)
    for split, t in summ.items():
        for src, s in sorted(t.items()):
            print("%-13s %-15s %7d docs %10d bytes" % (split, src, s["docs"], s["bytes"]))
        print("%-13s %-15s %7d docs %10d bytes" % (split, "TOTAL", sum(s["docs"] for s in t.values()),
                                                   sum(s["bytes"] for s in t.values())))


# ---------------------------------------------------------------- tokenize

def encode_all(texts, model_dir):
    """ids of each text, special tokens matched, no BOS added (ds41 tokenize --batch; the
    Hugging Face oracle when ./ds41 is not built)."""
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
        path = f.name
    try:
        ds41 = os.environ.get("DS41") or os.path.join(ROOT, "ds41")
        if os.path.exists(ds41):
            r = subprocess.run([ds41, "tokenize", "-m", model_dir, "--batch", path],
                               capture_output=True, check=True)
            rows = [json.loads(l) for l in r.stdout.decode().split("\n") if l]
            return [row["sp"] for row in rows]
        r = subprocess.run(["node", os.path.join(ROOT, "tests/oracle/encode_ids.js"), model_dir, path],
                           capture_output=True, check=True)
        return [json.loads(l) for l in r.stdout.decode().split("\n") if l]
    finally:
        os.unlink(path)


def tokenize(out, model_dir):
    import numpy as np
    vocab = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))
    ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    bos, eos = ids[BOS], ids[EOS]
    summ = json.load(open(os.path.join(out, "summary.json")))
    for split in ("train", "heldout", "heldout_chat"):
        p = os.path.join(out, split + ".jsonl")
        if not os.path.exists(p):
            continue
        docs = [json.loads(l) for l in open(p, encoding="utf-8")]
        enc = encode_all([d["text"] for d in docs], model_dir)
        assert len(enc) == len(docs)
        arr, offs = [], [0]
        for d, e in zip(docs, enc):
            if d["kind"] == "chat":
                assert e[0] == bos and e[-1] == eos, d["text"][:80]
                seq = e
            else:
                seq = [bos] + e + [eos]
            arr.extend(seq)
            offs.append(len(arr))
            s = summ[split][d["src"]]
            s["tokens"] = s.get("tokens", 0) + len(seq)
        a = np.asarray(arr, dtype="<u2")
        assert a.max() < 4096
        a.tofile(os.path.join(out, split + ".bin"))
        np.asarray(offs, dtype="<u8").tofile(os.path.join(out, split + ".idx"))
        t = summ[split]
        for src, s in sorted(t.items()):
            print("%-13s %-15s %7d docs %10d bytes %9d tokens (%.2f bytes/token)" % (
                split, src, s["docs"], s["bytes"], s["tokens"], s["bytes"] / s["tokens"]))
        print("%-13s %-15s %7d docs %10d bytes %9d tokens" % (
            split, "TOTAL", sum(s["docs"] for s in t.values()), sum(s["bytes"] for s in t.values()),
            len(arr)))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summ, f, indent=1)


def check_template(n, model_dir, data_dir):
    """Renders n chat documents' prompts with ./ds41 chat-template --text and compares."""
    import tempfile
    rng = random.Random(7)
    docs = [json.loads(l) for l in open(os.path.join(data_dir, "heldout_chat.jsonl"), encoding="utf-8")]
    docs = rng.sample(docs, min(n, len(docs)))
    bad = 0
    pairs = []
    for d in docs:
        t = d["text"]
        user = t[len(BOS + USER):t.index(ASSISTANT)]
        answer = t[t.index(ASSISTANT) + len(ASSISTANT + END_THINK):-len(EOS)]
        for msgs, gen in (([{"role": "user", "content": user}], True),
                          ([{"role": "user", "content": user}, {"role": "assistant", "content": answer}], False)):
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump({"messages": msgs}, f, ensure_ascii=False)
            cmd = [os.environ.get("DS41") or os.path.join(ROOT, "ds41"), "chat-template", "-m", model_dir, f.name, "--json"]
            if not gen:
                cmd.append("--no-generation-prompt")
            r = json.loads(subprocess.run(cmd, capture_output=True, check=True).stdout.decode())
            os.unlink(f.name)
            want = chat_prompt(user) if gen else t
            if r["text"] != want:
                bad += 1
                print("MISMATCH", repr(r["text"][:200]), repr(want[:200]))
            if not gen:
                pairs.append((t, r["ids"]))
    enc = encode_all([t for t, _ in pairs], model_dir)
    bad_ids = sum(e != ids for e, (_, ids) in zip(enc, pairs))
    print("chat-template check: %d conversations x 2 renderings, %d text mismatches, "
          "%d id mismatches (chat-template ids vs tokenize)" % (len(docs), bad, bad_ids))
    bad += bad_ids
    return bad == 0


def chatmix(out, model_dir, dest, only=False):
    """DEST/train.bin: the train split's tokens followed by a chat rendering ("What does WORD
    mean?") of every training GCIDE entry that has none (build() renders 18 %), so that about a
    third of the stream asks for a definition; DEST/heldout.bin: the held-out split as is. The text
    mixed into make train-vision's steps (tools/train/README.md): it teaches the chat answer's
    "WORD, POS." line while the general text keeps the held-out figures. only: DEST/train.bin holds
    the GCIDE chat renderings alone (build()'s and these), nothing else."""
    import shutil
    import numpy as np
    os.makedirs(dest, exist_ok=True)
    docs = [json.loads(l) for l in open(os.path.join(out, "train.jsonl"), encoding="utf-8")]
    have = {d["key"] for d in docs if d["src"] == "gcide-chat"}
    extra = [d["text"] for d in docs if only and d["src"] == "gcide-chat"]
    for d in docs:
        if d["src"] != "gcide" or d["key"] in have:
            continue
        word = d["text"].split(",", 1)[0].strip()
        if not word or "\n" in word or len(word) > 40:
            continue
        extra.append(render_chat(clean_specials("What does %s mean?" % word), clean_specials(cut_answer(d["text"]))))
    enc = encode_all(extra, model_dir)
    base = np.zeros(0, dtype="<u2") if only else np.fromfile(os.path.join(out, "train.bin"), dtype="<u2")
    add = np.asarray([t for e in enc for t in e], dtype="<u2")
    np.concatenate([base, add]).tofile(os.path.join(dest, "train.bin"))
    for f in ("heldout.bin", "heldout.idx"):
        shutil.copyfile(os.path.join(out, f), os.path.join(dest, f))
    print("chatmix: %d training tokens + %d tokens of %d chat renderings of GCIDE entries -> %s"
          % (len(base), len(add), len(extra), dest))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["build", "heldout", "tokenize", "check-template", "chatmix"])
    ap.add_argument("--dest", default=os.path.join(ROOT, "build/demo-chatmix"), help="chatmix's output folder")
    ap.add_argument("--only", action="store_true", help="chatmix: the GCIDE chat renderings alone")
    ap.add_argument("--out", default=os.path.join(ROOT, "build/demo-data"))
    ap.add_argument("-m", default=os.path.join(ROOT, "models/demo"))
    ap.add_argument("-n", type=int, default=300)
    a = ap.parse_args()
    if a.cmd == "build":
        build(a.out)
    elif a.cmd == "heldout":
        build(a.out, heldout_only=True)
    elif a.cmd == "tokenize":
        tokenize(a.out, a.m)
    elif a.cmd == "chatmix":
        chatmix(a.out, a.m, a.dest, a.only)
    else:
        sys.exit(0 if check_template(a.n, a.m, a.out) else 1)


if __name__ == "__main__":
    main()
