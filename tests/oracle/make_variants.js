#!/usr/bin/env node
// Writes variants of DeepSeek's tokenizer.json that exercise the parts of the format the
// real file does not use (other Split behaviours, invert, Digits, the GPT-2 ByteLevel
// regex with add_prefix_space, NFKC/NFC normalizers, lstrip/rstrip/single_word added tokens,
// ignore_merges, TemplateProcessing), so they too are checked against the Rust tokenizer.
// usage: make_variants.js SRC_DIR OUT_DIR   (creates OUT_DIR/<name>/tokenizer.json ...)
'use strict';
const fs = require('fs');
const path = require('path');
const [src, outDir] = process.argv.slice(2);
const base = fs.readFileSync(path.join(src, 'tokenizer.json'), 'utf8');
const fresh = () => JSON.parse(base);
const byteLevel = (prefix, regex) => ({ type: 'ByteLevel', add_prefix_space: prefix, trim_offsets: true, use_regex: regex });
const split = (pattern, behavior, invert = false, literal = false) =>
  ({ type: 'Split', pattern: literal ? { String: pattern } : { Regex: pattern }, behavior, invert });

const variants = {
  // GPT-2 style: the ByteLevel regex and a prefix space; BOS and EOS from a template
  gpt2: (j) => {
    j.pre_tokenizer = byteLevel(true, true);
    j.post_processor = {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<｜begin▁of▁sentence｜>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
        { SpecialToken: { id: '<｜end▁of▁sentence｜>', type_id: 0 } }],
      pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: {
        '<｜begin▁of▁sentence｜>': { id: '<｜begin▁of▁sentence｜>', ids: [0], tokens: ['<｜begin▁of▁sentence｜>'] },
        '<｜end▁of▁sentence｜>': { id: '<｜end▁of▁sentence｜>', ids: [1], tokens: ['<｜end▁of▁sentence｜>'] },
      },
    };
  },
  // every Split behaviour, invert, a String pattern, Digits
  behaviors: (j) => {
    j.pre_tokenizer = { type: 'Sequence', pretokenizers: [
      split('\\p{N}{1,2}', 'MergedWithPrevious'),
      split(' ', 'MergedWithNext', false, true),
      split('[,;]', 'Removed'),
      split('[\\p{L}]+', 'Contiguous', true),
      { type: 'Digits', individual_digits: false },
      split('\\s+', 'Isolated'),
      byteLevel(false, false),
    ] };
    j.post_processor = null;
  },
  // a normalizer (NFKC: full-width bars become ASCII, so the normalized added tokens match
  // "<|User|>"), added-token flags, individual digits, ignore_merges
  normalized: (j) => {
    j.normalizer = { type: 'Sequence', normalizers: [{ type: 'NFKC' }] };
    j.pre_tokenizer.pretokenizers.unshift({ type: 'Digits', individual_digits: true });
    j.model.ignore_merges = true;
    for (const t of j.added_tokens) {
      if (t.content === '<｜User｜>') t.lstrip = true;
      if (t.content === '<｜Assistant｜>') t.rstrip = true;
      if (t.content === '<｜tool▁sep｜>') { t.lstrip = true; t.rstrip = true; }
      if (t.content === '<|EOT|>') t.single_word = true;
      if (t.content === '<｜fim▁hole｜>') t.normalized = false;
    }
    j.post_processor = null;
  },
  nfc_mixed: (j) => {
    j.normalizer = { type: 'NFC' };
    j.pre_tokenizer.pretokenizers[2].behavior = 'MergedWithPrevious';
    j.post_processor = { type: 'Sequence', processors: [{ type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false }] };
  },
};

for (const [name, f] of Object.entries(variants)) {
  const j = fresh();
  f(j);
  const dir = path.join(outDir, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(j));
  if (name === 'normalized') {
    fs.writeFileSync(path.join(dir, 'tokenizer_config.json'),
      JSON.stringify({ add_bos_token: false, add_eos_token: true, eos_token: '<｜end▁of▁sentence｜>', bos_token: '<｜begin▁of▁sentence｜>' }));
  }
  console.log(name);
}
