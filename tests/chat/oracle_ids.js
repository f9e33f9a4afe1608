// Token ids of prompt texts from the Hugging Face tokenizer (Rust, npm `tokenizers`): the
// oracle for `ds41 chat-template --json` ids. Usage: node oracle_ids.js TOKENIZER.json FILE...
// Prints one JSON array of ids per file. No special tokens are added (the rendered prompt
// already holds its BOS text), as vLLM and sglang encode DeepSeek V4.x prompts.
"use strict";
const path = require("path");
const fs = require("fs");
const { Tokenizer } = require(path.join(__dirname, "..", "oracle", "node_modules", "tokenizers"));

async function main() {
  const [tokPath, ...files] = process.argv.slice(2);
  if (!tokPath || !files.length) {
    console.error("usage: node oracle_ids.js TOKENIZER.json FILE...");
    process.exit(2);
  }
  const tok = Tokenizer.fromFile(tokPath);
  for (const f of files) {
    const enc = await tok.encode(fs.readFileSync(f, "utf8"), null, { addSpecialTokens: false });
    console.log(JSON.stringify(enc.getIds()));
  }
}
main().catch((e) => { console.error(e.message || e); process.exit(1); });
