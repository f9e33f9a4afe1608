#!/usr/bin/env node
// Independent construction of the Engram compressed-token map (spec 1.7) with the Rust
// tokenizer and JavaScript string functions, to check ds41's utf8proc-based one.
// usage: engram_map.js TOKENIZER_DIR VOCAB_SIZE OUT.i32 [DECODED.jsonl]
// Writes the map as little-endian int32 (one per id), and with DECODED.jsonl also each
// id's decode as one JSON string per line (for checking ds41's single-id decode).
'use strict';
const fs = require('fs');
const { load } = require('./hf_tokenizer');

// Unicode White_Space (Rust's char::is_whitespace, used by Hugging Face's Strip); JavaScript's
// trim() uses a different set (it has U+FEFF and lacks U+0085), so it is spelled out.
const WS = '[\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]';
const stripRe = new RegExp('^' + WS + '+|' + WS + '+$', 'gu');

function normalize(text) {
  let s = text.normalize('NFKC').normalize('NFD');
  s = s.replace(/\p{M}/gu, '');                                 // StripAccents: combining marks
  s = Array.from(s, (c) => c.toLowerCase()).join('');             // Lowercase, char by char (no final-sigma rule)
  s = s.replace(/[ \t\r\n]+/g, ' ');                             // collapse whitespace runs
  if (s === ' ') s = '\ue000';                                    // protect a lone space ...
  s = s.replace(stripRe, '');                                     // ... from Strip
  return s.replace(/\ue000/g, ' ');                               // sentinel (and any literal U+E000) -> space
}

async function main() {
  const [dir, vocabArg, outPath, decodedPath] = process.argv.slice(2);
  const vocabSize = Number(vocabArg);
  if (!dir || !(vocabSize > 0) || !outPath) { console.error('usage: engram_map.js DIR VOCAB_SIZE OUT.i32 [DECODED.jsonl]'); process.exit(2); }
  const tok = load(dir);
  const ids = Array.from({ length: vocabSize }, (_, i) => [i]);
  const texts = await tok.decodeBatch(ids, false);
  const keys = new Map();
  const map = new Int32Array(vocabSize);
  for (let id = 0; id < vocabSize; id++) {
    const text = texts[id];
    let key;
    if (text.includes('\ufffd')) {
      key = tok.idToToken(id);                                    // partial UTF-8: the raw vocab string
    } else {
      const n = normalize(text);
      key = n.length ? n : text;
    }
    if (!keys.has(key)) keys.set(key, keys.size);
    map[id] = keys.get(key);
  }
  const buf = Buffer.alloc(4 * vocabSize);
  for (let i = 0; i < vocabSize; i++) buf.writeInt32LE(map[i], 4 * i);
  fs.writeFileSync(outPath, buf);
  if (decodedPath) fs.writeFileSync(decodedPath, texts.map((t) => JSON.stringify(t)).join('\n') + '\n');
  console.log(`engram token map (oracle): ${vocabSize} ids -> ${keys.size} compressed ids`);
}
main().catch((e) => { console.error(e); process.exit(1); });
