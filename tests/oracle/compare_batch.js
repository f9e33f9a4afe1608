#!/usr/bin/env node
// Compares `ds41 tokenize --batch` output with tokenize_corpus.js output, field by field,
// and prints one PASS/FAIL line per field (with the first mismatches shown).
// usage: compare_batch.js CORPUS.jsonl ORACLE.jsonl DS41.jsonl PREFIX [same-roundtrip]
'use strict';
const fs = require('fs');
const [corpusPath, oraclePath, ds41Path, prefix] = process.argv.slice(2);
const read = (p) => fs.readFileSync(p, 'utf8').split('\n').filter((l) => l.length);
const corpus = read(corpusPath).map((l) => JSON.parse(l));
const oracle = read(oraclePath).map((l) => JSON.parse(l));
let ds41;
try { ds41 = read(ds41Path).map((l) => JSON.parse(l)); } catch (e) { ds41 = []; }
const show = (v) => { const s = JSON.stringify(typeof v === 'string' ? v : v.hex ? 'hex:' + v.hex : v); return s.length > 80 ? s.slice(0, 77) + '...' : s; };
const ids = (a) => { const s = JSON.stringify(a); return s.length > 120 ? s.slice(0, 117) + '...' : s; };
const valid = corpus.filter((v) => typeof v === 'string').length;
console.log(`# ${corpus.length} corpus lines (${valid} strings, ${corpus.length - valid} invalid UTF-8 byte strings)`);
if (oracle.length !== corpus.length) { console.log(`FAIL ${prefix}_oracle_ran: ${oracle.length} oracle results for ${corpus.length} lines`); process.exit(0); }
console.log(`PASS ${prefix}_oracle_ran`);
if (ds41.length !== corpus.length) { console.log(`FAIL ${prefix}_ds41_ran: ${ds41.length} ds41 results for ${corpus.length} lines`); process.exit(0); }
console.log(`PASS ${prefix}_ds41_ran`);
const fields = [
  ['sp', 'ids_special_tokens_matched', (i) => true],
  ['ns', 'ids_special_tokens_as_text', (i) => true],
  ['bos', 'ids_with_post_processor', (i) => true],
];
for (const [f, name, sel] of fields) {
  const bad = [];
  for (let i = 0; i < corpus.length; i++) {
    if (!sel(i)) continue;
    if (JSON.stringify(oracle[i][f]) !== JSON.stringify(ds41[i][f])) bad.push(i);
  }
  if (!bad.length) console.log(`PASS ${prefix}_${name}`);
  else {
    console.log(`FAIL ${prefix}_${name}: ${bad.length} of ${corpus.length} lines differ from the oracle`);
    for (const i of bad.slice(0, 5)) console.log(`  line ${i + 1} ${show(corpus[i])}\n    oracle ${ids(oracle[i][f])}\n    ds41   ${ids(ds41[i][f])}`);
  }
}
// decode(encode(s)) == s (for invalid UTF-8: the lossy text), on both sides. With
// `same-roundtrip` (tokenizers that normalize, strip or add a prefix space) the check is
// that ds41's decode agrees with the oracle's on whether the text comes back.
if (process.argv[6] === 'same-roundtrip') {
  const bad = [];
  for (let i = 0; i < corpus.length; i++) if (oracle[i].rt !== ds41[i].rt) bad.push(i);
  if (!bad.length) console.log(`PASS ${prefix}_roundtrip_agrees`);
  else {
    console.log(`FAIL ${prefix}_roundtrip_agrees: decode(encode(s)) == s differs from the oracle on ${bad.length} lines`);
    for (const i of bad.slice(0, 5)) console.log(`  line ${i + 1} ${show(corpus[i])} oracle ${oracle[i].rt} ds41 ${ds41[i].rt}`);
  }
  process.exit(0);
}
for (const [who, res] of [['ds41', ds41], ['oracle', oracle]]) {
  const bad = [];
  for (let i = 0; i < corpus.length; i++) if (res[i].rt !== true) bad.push(i);
  if (!bad.length) console.log(`PASS ${prefix}_roundtrip_${who}`);
  else {
    console.log(`FAIL ${prefix}_roundtrip_${who}: decode(encode(s)) != s for ${bad.length} lines`);
    for (const i of bad.slice(0, 5)) console.log(`  line ${i + 1} ${show(corpus[i])}`);
  }
}
