// What the SDK drivers share (api_messages.mjs, api_responses.mjs, vision_sdk.mjs): the
// official clients from tests/oracle pointed at a ds41 serve port, and the PASS / FAIL lines.
import { createRequire } from "module";
const require = createRequire(import.meta.url);
export const Anthropic = require("../oracle/node_modules/@anthropic-ai/sdk").default;
export const OpenAI = require("../oracle/node_modules/openai").default;

export function anthropicClient(port) {
  return new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: "unused", maxRetries: 0, timeout: 120000 });
}
export function openaiClient(port) {
  return new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "unused", maxRetries: 0, timeout: 120000 });
}

let failed = 0;
export const failures = () => failed;
export function check(name, cond, why) {
  if (cond) console.log(`PASS ${name}`);
  else { failed++; console.log(`FAIL ${name}: ${typeof why === "string" ? why : JSON.stringify(why)}`.slice(0, 900)); }
}
// runs fn; an exception is a FAIL of name
export async function test(name, fn) {
  try { await fn(); } catch (e) { failed++; console.log(`FAIL ${name}: threw ${e && (e.stack || e)}`.slice(0, 900)); }
}
