// The official OpenAI Node SDK (npm `openai`, tests/oracle) against a running `ds41 serve`:
// chat (plain, streamed, n, logprobs, stop, thinking), a tool-call round trip, completions
// (text, token ids, echo, logprobs, streamed), models, and the SDK's error classes.
//   node tests/serve/sdk.mjs PORT API_KEY
// Prints PASS / FAIL lines.
import { createRequire } from "module";
const require = createRequire(import.meta.url);
const OpenAI = require("../oracle/node_modules/openai").default;

const port = process.argv[2], key = process.argv[3];
const baseURL = `http://127.0.0.1:${port}/v1`;
const client = new OpenAI({ baseURL, apiKey: key, maxRetries: 0, timeout: 60000 });
let failed = 0;
function check(name, cond, why) {
  if (cond) console.log(`PASS ${name}`);
  else { failed++; console.log(`FAIL ${name}: ${typeof why === "string" ? why : JSON.stringify(why)}`.slice(0, 600)); }
}
async function test(name, fn) {
  try { await fn(); } catch (e) { failed++; console.log(`FAIL ${name}: threw ${e && (e.stack || e)}`.slice(0, 800)); }
}

const models = await client.models.list();
const model = models.data[0].id;
await test("sdk_models", async () => {
  check("sdk_models", models.data.length === 1 && models.data[0].object === "model" && typeof model === "string", models);
  const one = await client.models.retrieve(model);
  check("sdk_models_retrieve", one.id === model, one);
});

await test("sdk_chat", async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello world" }],
    max_tokens: 6, seed: 7, temperature: 0.7 });
  const c = r.choices[0];
  check("sdk_chat", r.object === "chat.completion" && c.message.role === "assistant" && typeof c.message.content === "string" &&
        c.finish_reason === "length" && r.usage.completion_tokens === 6 && r.usage.prompt_tokens > 5 &&
        r.usage.total_tokens === r.usage.prompt_tokens + 6, r);
  const again = await client.chat.completions.create({
    model, messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello world" }],
    max_tokens: 6, seed: 7, temperature: 0.7 });
  check("sdk_chat_seed_reproducible", again.choices[0].message.content === c.message.content, [c.message.content, again.choices[0].message.content]);
});

await test("sdk_chat_stream", async () => {
  const req = { model, messages: [{ role: "user", content: "Tell me about Paris" }], max_tokens: 10, seed: 3, temperature: 0.9 };
  const full = await client.chat.completions.create(req);
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = "", role = null, finish = null, usage = null, chunks = 0;
  for await (const ch of stream) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  check("sdk_chat_stream", role === "assistant" && finish === "length" && chunks >= 3, { role, finish, chunks });
  check("sdk_chat_stream_equals_plain", text === full.choices[0].message.content, [text, full.choices[0].message.content]);
  check("sdk_chat_stream_usage", usage && usage.completion_tokens === 10 && usage.prompt_tokens === full.usage.prompt_tokens, usage);
});

await test("sdk_chat_n_logprobs", async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Hi" }], max_tokens: 4, n: 3,
                                                   seed: 11, temperature: 1.0, logprobs: true, top_logprobs: 3 });
  const ok = r.choices.length === 3 && r.choices.every((c, i) => c.index === i && c.logprobs.content.length === 4 &&
    c.logprobs.content.every(t => t.logprob <= 0 && t.top_logprobs.length === 3 &&
      t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob && Array.isArray(t.bytes)));
  check("sdk_chat_n_logprobs", ok && r.usage.completion_tokens === 12, r.choices.map(c => c.logprobs));
  // greedy: the sampled token is the best alternative
  const g = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Hi" }], max_tokens: 4,
                                                   temperature: 0, logprobs: true, top_logprobs: 2 });
  check("sdk_chat_greedy_logprobs", g.choices[0].logprobs.content.every(t => t.token === t.top_logprobs[0].token &&
        Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6), g.choices[0].logprobs);
});

await test("sdk_chat_stop", async () => {
  const base = { model, messages: [{ role: "user", content: "Say something" }], max_tokens: 24, seed: 5, temperature: 1.0 };
  const full = (await client.chat.completions.create(base)).choices[0].message.content;
  // a stop string taken from the middle of the unconstrained output
  const chars = Array.from(full);
  const stop = chars.slice(4, 6).join("");
  // the output of this seed is fixed for the test checkpoint: it must offer a usable stop string
  if (chars.length < 8 || stop.includes("\ufffd")) { check("sdk_chat_stop", false, "no usable stop string in " + JSON.stringify(full)); return; }
  const cut = await client.chat.completions.create({ ...base, stop: [stop] });
  const want = full.slice(0, full.indexOf(stop));
  check("sdk_chat_stop", cut.choices[0].message.content === want && cut.choices[0].finish_reason === "stop",
        { full, stop, got: cut.choices[0].message.content, want });
  const st = await client.chat.completions.create({ ...base, stop: [stop], stream: true });
  let text = "", fin = null;
  for await (const ch of st) for (const c of ch.choices) { if (c.delta.content) text += c.delta.content; if (c.finish_reason) fin = c.finish_reason; }
  check("sdk_chat_stop_stream", text === want && fin === "stop", { text, want, fin });
});

await test("sdk_chat_thinking", async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Think" }], max_tokens: 8,
                                                   seed: 2, reasoning_effort: "high" });
  const m = r.choices[0].message;
  check("sdk_chat_thinking", typeof m.reasoning_content === "string" && m.reasoning_content.length + (m.content || "").length > 0, m);
});

const tools = [{ type: "function", function: { name: "get_weather", description: "Weather of a city",
  parameters: { type: "object", properties: { location: { type: "string" }, days: { type: "integer" } }, required: ["location"] } } }];

await test("sdk_tool_round_trip", async () => {
  // 1. a request offering tools (the random model will not call them: the reply is text or calls)
  const r1 = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Weather in Paris?" }], tools,
                                                    tool_choice: "auto", max_tokens: 6, seed: 1 });
  const c1 = r1.choices[0];
  check("sdk_tools_offered", ["length", "stop", "tool_calls"].includes(c1.finish_reason) && r1.usage.prompt_tokens > 100, r1);
  // 2. the assistant's tool call and the tool's result go back: rendered as DSML + <tool_result>
  const msgs = [{ role: "user", content: "Weather in Paris?" },
    { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function",
      function: { name: "get_weather", arguments: JSON.stringify({ location: "Paris", days: 2 }) } }] },
    { role: "tool", tool_call_id: "call_1", content: "sunny, 21 C" }];
  const r2 = await client.chat.completions.create({ model, messages: msgs, tools, max_tokens: 6, seed: 1 });
  check("sdk_tool_result_turn", r2.choices[0].message.role === "assistant" && r2.usage.prompt_tokens > r1.usage.prompt_tokens, r2.usage);
  const none = await client.chat.completions.create({ model, messages: msgs, tools, tool_choice: "none", max_tokens: 2, seed: 1 });
  check("sdk_tool_choice_none", none.usage.prompt_tokens < r2.usage.prompt_tokens, [none.usage, r2.usage]);
  // 3. /tokenize renders messages + tools exactly as the chat endpoint does
  const tk = await fetch(`http://127.0.0.1:${port}/tokenize`, { method: "POST", headers: { authorization: `Bearer ${key}` },
    body: JSON.stringify({ messages: msgs, tools }) }).then(x => x.json());
  check("sdk_tokenize_messages", tk.count === r2.usage.prompt_tokens && tk.tokens.length === tk.count, [tk.count, r2.usage]);
});

await test("sdk_completions", async () => {
  const r = await client.completions.create({ model, prompt: "Hello world", max_tokens: 5, temperature: 0, logprobs: 2, echo: true });
  const c = r.choices[0];
  check("sdk_completions", r.object === "text_completion" && c.text.startsWith("Hello world") && c.logprobs.tokens.length === 5 &&
        c.logprobs.top_logprobs.length === 5 && r.usage.completion_tokens === 5, r);
  const ids = await client.completions.create({ model, prompt: [0, 85, 351, 285], max_tokens: 3, temperature: 0 });
  const txt = await client.completions.create({ model, prompt: "Hello", max_tokens: 3, temperature: 0 });
  check("sdk_completions_token_ids", ids.choices[0].text === txt.choices[0].text && ids.usage.prompt_tokens === 4, [ids, txt]);
  const multi = await client.completions.create({ model, prompt: ["Hello", "The weather"], max_tokens: 2, n: 2, seed: 4 });
  check("sdk_completions_batch", multi.choices.length === 4 && multi.choices.map(c => c.index).join() === "0,1,2,3", multi);
  const st = await client.completions.create({ model, prompt: "Hello", max_tokens: 3, temperature: 0, stream: true });
  let s = "";
  for await (const ch of st) s += ch.choices[0]?.text || "";
  check("sdk_completions_stream", s === txt.choices[0].text, [s, txt.choices[0].text]);
});

async function expectError(name, fn, status, cls) {
  try {
    await fn();
    check(name, false, "no error");
  } catch (e) {
    check(name, e instanceof cls && e.status === status && e.error && typeof e.error.message === "string" &&
          "type" in e.error && "param" in e.error && "code" in e.error, { status: e.status, error: e.error, name: e.constructor.name });
  }
}
await test("sdk_errors", async () => {
  await expectError("sdk_error_bad_temperature", () => client.chat.completions.create({ model, messages: [{ role: "user", content: "x" }],
    temperature: 9 }), 400, OpenAI.BadRequestError);
  await expectError("sdk_error_bad_role", () => client.chat.completions.create({ model, messages: [{ role: "wizard", content: "x" }] }),
    400, OpenAI.BadRequestError);
  await expectError("sdk_error_unknown_model", () => client.chat.completions.create({ model: "gpt-nope", messages: [{ role: "user", content: "x" }] }),
    404, OpenAI.NotFoundError);
  await expectError("sdk_error_context", () => client.completions.create({ model, prompt: "x", max_tokens: 100000 }),
    400, OpenAI.BadRequestError);
  await expectError("sdk_error_vocab", () => client.completions.create({ model, prompt: [1, 99999], max_tokens: 1 }),
    400, OpenAI.BadRequestError);
  const bad = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
  await expectError("sdk_error_api_key", () => bad.models.list(), 401, OpenAI.AuthenticationError);
});

console.log(`sdk: ${failed} failed`);
process.exit(failed ? 1 : 0);
