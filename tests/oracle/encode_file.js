#!/usr/bin/env node
// Encodes a whole file (read as UTF-8, lossy like a user's decoder) as one text with the
// oracle and prints the ids on one line, separated by spaces: the output format of
// `ds41 tokenize -m DIR -`.  usage: encode_file.js TOKENIZER_DIR FILE [--no-special] [--no-bos]
'use strict';
const fs = require('fs');
const { load } = require('./hf_tokenizer');
(async () => {
  const [dir, file, ...flags] = process.argv.slice(2);
  const tok = load(dir, { special: !flags.includes('--no-special') });
  const text = fs.readFileSync(file).toString('utf8');
  const enc = await tok.encode(text, null, { addSpecialTokens: !flags.includes('--no-bos') });
  process.stdout.write(enc.getIds().join(' ') + '\n');
})().catch((e) => { console.error(e); process.exit(1); });
