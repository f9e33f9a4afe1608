#!/usr/bin/env node
// Hugging Face (Rust `tokenizers` via npm) encode throughput on the same documents as
// bench_tokenizer.c: FILE cut at line boundaries into documents of at least CHUNK bytes,
// encoded with encodeBatch on ONE thread (run with TOKENIZERS_PARALLELISM=false and
// RAYON_NUM_THREADS=1), no special post-processing, best of N passes.
// usage: tokenizer_oracle.js TOKENIZER_DIR FILE [CHUNK] [REPEAT]   -> one JSON line
'use strict';
const fs = require('fs');
const path = require('path');
const { load } = require(path.join(__dirname, '..', 'tests', 'oracle', 'hf_tokenizer'));

(async () => {
  const [dir, file, chunkArg, repeatArg] = process.argv.slice(2);
  const chunk = Number(chunkArg || 4096), repeat = Number(repeatArg || 3);
  if (process.env.TOKENIZERS_PARALLELISM !== 'false') console.error('warning: TOKENIZERS_PARALLELISM is not false: encodeBatch may use several threads');
  const buf = fs.readFileSync(file);
  const docs = [];
  for (let p = 0; p < buf.length;) {
    let q = Math.min(p + chunk, buf.length);
    if (q < buf.length) { const nl = buf.indexOf(10, q); q = nl < 0 ? buf.length : nl + 1; }
    docs.push(buf.subarray(p, q).toString('utf8'));
    p = q;
  }
  const tok = load(dir);
  let best = Infinity, tokens = 0;
  for (let r = 0; r < repeat; r++) {
    const t0 = process.hrtime.bigint();
    const encs = await tok.encodeBatch(docs, { addSpecialTokens: false });
    const t = Number(process.hrtime.bigint() - t0) / 1e9;
    if (t < best) best = t;
    tokens = 0;
    for (const e of encs) tokens += e.getLength();
  }
  console.log(JSON.stringify({ impl: 'hf-tokenizers', bytes: buf.length, docs: docs.length, tokens, seconds: Number(best.toFixed(4)), mb_per_s: Number((buf.length / 1e6 / best).toFixed(2)) }));
})().catch((e) => { console.error(e); process.exit(1); });
