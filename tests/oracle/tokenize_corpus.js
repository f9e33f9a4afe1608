#!/usr/bin/env node
// Oracle side of the tokenizer conformance test: for each line of a corpus (a JSON string,
// or {"hex": "..."} for raw bytes, decoded as a user would: lossy UTF-8) prints
//   {"sp":ids,"ns":ids,"bos":ids,"rt":bool}
// sp: special tokens matched, no post-processor; ns: special-token text not matched;
// bos: with the post-processor; rt: decode(sp) and decode(ns) give the (lossy) text back.
// The same format as `ds41 tokenize --batch`, so the two outputs compare byte for byte.
// usage: tokenize_corpus.js TOKENIZER_DIR CORPUS.jsonl > out.jsonl
'use strict';
const fs = require('fs');
const { load } = require('./hf_tokenizer');

async function main() {
  const [dir, corpus] = process.argv.slice(2);
  if (!dir || !corpus) { console.error('usage: tokenize_corpus.js TOKENIZER_DIR CORPUS.jsonl'); process.exit(2); }
  const tok = load(dir), tokNs = load(dir, { special: false });
  const lines = fs.readFileSync(corpus, 'utf8').split('\n').filter((l) => l.length);
  const out = [];
  for (const line of lines) {
    const v = JSON.parse(line);
    const s = typeof v === 'string' ? v : Buffer.from(v.hex, 'hex').toString('utf8');
    const sp = (await tok.encode(s, null, { addSpecialTokens: false })).getIds();
    const ns = (await tokNs.encode(s, null, { addSpecialTokens: false })).getIds();
    const bos = (await tok.encode(s, null, { addSpecialTokens: true })).getIds();
    const rt = (await tok.decode(sp, false)) === s && (await tok.decode(ns, false)) === s;
    out.push(JSON.stringify({ sp, ns, bos, rt }));
  }
  process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
}
main().catch((e) => { console.error(e); process.exit(1); });
