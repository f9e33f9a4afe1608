// POST /v1/messages and /v1/messages/count_tokens through the official Anthropic SDK (npm
// `@anthropic-ai/sdk`, tests/oracle) against an exact `ds41 serve` on models/demo. Every greedy
// answer is compared with the same conversation through /v1/chat/completions (the OpenAI SDK):
// the same prompt must give the same tokens. Tool inputs validate against input_schema (ajv).
//   node tests/serve/api_messages.mjs PORT [SPEC_PORT]
// With SPEC_PORT (an exact --spec fixed:k server) its greedy answers must equal PORT's.
// Prints PASS / FAIL lines; exits 1 if any failed.
import { createRequire } from "module";
import { anthropicClient, check, failures, openaiClient, test } from "./sdk_check.mjs";
const require = createRequire(import.meta.url);
const Ajv = require("../oracle/node_modules/ajv").default;

const port = process.argv[2];
const ant = anthropicClient(port), oai = openaiClient(port);
const model = (await oai.models.list()).data[0].id;
const textOf = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");
const sys = "You are terse.";
const user = "What does telescope mean?";

await test("messages_create_equals_chat", async () => {
  const m = await ant.messages.create({ model, max_tokens: 12, temperature: 0, system: sys, messages: [{ role: "user", content: user }] });
  const c = await oai.chat.completions.create({ model, max_tokens: 12, temperature: 0,
    messages: [{ role: "system", content: sys }, { role: "user", content: user }] });
  check("messages_create_shape", m.type === "message" && m.role === "assistant" && m.id.startsWith("msg_") && m.model === model &&
        m.content.length === 1 && m.content[0].type === "text" && m.stop_reason === "max_tokens" && m.stop_sequence === null, m);
  check("messages_create_equals_chat", textOf(m) === c.choices[0].message.content, { m: textOf(m), c: c.choices[0].message.content });
  check("messages_usage", m.usage.output_tokens === 12 && m.usage.input_tokens + m.usage.cache_read_input_tokens === c.usage.prompt_tokens,
        { m: m.usage, c: c.usage });
  // system as blocks is the same prompt
  const m2 = await ant.messages.create({ model, max_tokens: 12, temperature: 0, system: [{ type: "text", text: sys }],
    messages: [{ role: "user", content: [{ type: "text", text: user }] }] });
  check("messages_system_blocks", textOf(m2) === textOf(m), { a: textOf(m2), b: textOf(m) });
});

await test("messages_count_tokens", async () => {
  const n = await ant.messages.countTokens({ model, system: sys, messages: [{ role: "user", content: user }] });
  const c = await oai.chat.completions.create({ model, max_tokens: 1, messages: [{ role: "system", content: sys }, { role: "user", content: user }] });
  check("messages_count_tokens", n.input_tokens === c.usage.prompt_tokens, { n, c: c.usage });
  const tools = [{ name: "get_weather", description: "Weather in a city", input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];
  const nt = await ant.messages.countTokens({ model, system: sys, messages: [{ role: "user", content: user }], tools });
  const ct = await oai.chat.completions.create({ model, max_tokens: 1, messages: [{ role: "system", content: sys }, { role: "user", content: user }],
    tools: [{ type: "function", function: { name: "get_weather", description: "Weather in a city", parameters: tools[0].input_schema } }] });
  check("messages_count_tokens_tools", nt.input_tokens === ct.usage.prompt_tokens && nt.input_tokens > n.input_tokens, { nt, ct: ct.usage });
});

await test("messages_stream", async () => {
  const req = { model, max_tokens: 10, temperature: 0, system: sys, messages: [{ role: "user", content: user }] };
  const whole = await ant.messages.create(req);
  const count = await ant.messages.countTokens({ model, system: sys, messages: req.messages });
  const events = [];
  const s = ant.messages.stream(req);
  s.on("streamEvent", (ev) => events.push(ev));
  const fin = await s.finalMessage();
  const names = events.map((e) => e.type);
  const start = events[0];
  check("messages_stream_order", names[0] === "message_start" && names[1] === "content_block_start" && names.at(-1) === "message_stop" &&
        names.at(-2) === "message_delta" && names.at(-3) === "content_block_stop", names);
  check("messages_stream_input_tokens", start.message.usage.input_tokens + start.message.usage.cache_read_input_tokens === count.input_tokens,
        { start: start.message.usage, count });
  const deltas = events.filter((e) => e.type === "content_block_delta").map((e) => e.delta.text).join("");
  check("messages_stream_equals_create", textOf(fin) === textOf(whole) && deltas === textOf(whole) && fin.stop_reason === "max_tokens" &&
        fin.usage.output_tokens === 10, { fin, whole: textOf(whole), deltas });
});

await test("messages_stop_sequence", async () => {
  const req = { model, max_tokens: 16, temperature: 0, messages: [{ role: "user", content: user }] };
  const full = textOf(await ant.messages.create(req));
  const k = Math.floor(full.length / 2);
  const stop = full.slice(k, k + 2);
  const m = await ant.messages.create({ ...req, stop_sequences: [stop] });
  check("messages_stop_sequence", m.stop_reason === "stop_sequence" && m.stop_sequence === stop && textOf(m) === full.slice(0, full.indexOf(stop)),
        { full, stop, m });
});

const weather = { type: "object", properties: { city: { type: "string", enum: ["Paris", "Rome"] }, days: { type: "integer" } }, required: ["city", "days"],
                  additionalProperties: false };
const tools = [{ name: "get_weather", description: "Weather forecast for a city", input_schema: weather },
               { name: "get_time", description: "Local time", input_schema: { type: "object", properties: { zone: { type: "string", enum: ["UTC", "CET"] } }, required: ["zone"] } }];
const validate = new Ajv().compile(weather);

await test("messages_tools", async () => {
  const ask = [{ role: "user", content: "What is the weather in Paris?" }];
  const m = await ant.messages.create({ model, max_tokens: 400, temperature: 0, tools, tool_choice: { type: "tool", name: "get_weather" }, messages: ask });
  const tu = m.content.filter((b) => b.type === "tool_use");
  check("messages_tool_forced", m.stop_reason === "tool_use" && tu.length === 1 && tu[0].name === "get_weather" && tu[0].id.startsWith("toolu_") &&
        validate(tu[0].input) && !JSON.stringify(m.content).includes("DSML"), { m, errors: validate.errors });
  // the same forced call through chat completions gives the same arguments
  const c = await oai.chat.completions.create({ model, max_tokens: 400, temperature: 0, messages: ask,
    tools: tools.map((t) => ({ type: "function", function: { name: t.name, description: t.description, parameters: t.input_schema } })),
    tool_choice: { type: "function", function: { name: "get_weather" } } });
  const cc = c.choices[0].message.tool_calls;
  check("messages_tool_equals_chat", cc && cc.length === 1 && JSON.stringify(JSON.parse(cc[0].function.arguments)) === JSON.stringify(tu[0].input),
        { chat: cc, msg: tu });
  // any: some call is forced
  const a = await ant.messages.create({ model, max_tokens: 400, temperature: 0, tools, tool_choice: { type: "any" }, messages: ask });
  check("messages_tool_any", a.stop_reason === "tool_use" && a.content.some((b) => b.type === "tool_use" && tools.some((t) => t.name === b.name)), a);
  // streamed: the tool_use block's input assembles from input_json_delta into the same input
  const s = ant.messages.stream({ model, max_tokens: 400, temperature: 0, tools, tool_choice: { type: "tool", name: "get_weather" }, messages: ask });
  const partial = [];
  s.on("streamEvent", (ev) => { if (ev.type === "content_block_delta" && ev.delta.type === "input_json_delta") partial.push(ev.delta.partial_json); });
  const fin = await s.finalMessage();
  const ftu = fin.content.filter((b) => b.type === "tool_use");
  check("messages_tool_stream", fin.stop_reason === "tool_use" && ftu.length === 1 && JSON.stringify(ftu[0].input) === JSON.stringify(tu[0].input) &&
        JSON.stringify(JSON.parse(partial.join(""))) === JSON.stringify(tu[0].input), { fin, partial });
  // round trip: tool_use -> tool_result, answered as the chat route answers the same history
  const hist = [...ask, { role: "assistant", content: m.content },
                { role: "user", content: [{ type: "tool_result", tool_use_id: tu[0].id, content: "Sunny, 21 C" }] }];
  const r = await ant.messages.create({ model, max_tokens: 10, temperature: 0, tools, messages: hist });
  const cr = await oai.chat.completions.create({ model, max_tokens: 10, temperature: 0,
    tools: tools.map((t) => ({ type: "function", function: { name: t.name, description: t.description, parameters: t.input_schema } })),
    messages: [...ask, { role: "assistant", content: null, tool_calls: [{ id: tu[0].id, type: "function", function: { name: "get_weather", arguments: JSON.stringify(tu[0].input) } }] },
               { role: "tool", tool_call_id: tu[0].id, content: "Sunny, 21 C" }] });
  const n1 = await ant.messages.countTokens({ model, tools, messages: hist });
  check("messages_tool_result_round_trip", r.type === "message" && textOf(r) === (cr.choices[0].message.content || "") &&
        n1.input_tokens === cr.usage.prompt_tokens, { r, chat: cr.choices[0].message, n1, cu: cr.usage });
});

await test("messages_thinking", async () => {
  const req = { model, max_tokens: 16, temperature: 0, thinking: { type: "enabled", budget_tokens: 8 }, messages: [{ role: "user", content: user }] };
  const m = await ant.messages.create(req);
  const c = await oai.chat.completions.create({ model, max_tokens: 16, temperature: 0, messages: [{ role: "user", content: user }],
    chat_template_kwargs: { thinking: true }, thinking_token_budget: 8 });
  const th = m.content.filter((b) => b.type === "thinking").map((b) => b.thinking).join("");
  check("messages_thinking_equals_chat", m.content[0].type === "thinking" && th === c.choices[0].message.reasoning_content &&
        textOf(m) === (c.choices[0].message.content || ""), { m, c: c.choices[0].message });
  // budget_tokens holds: at most 8 tokens of reasoning, then </think> (the demo model does not
  // end its reasoning by itself within 16 tokens), so the answer gets the rest of max_tokens
  const rt = c.usage.completion_tokens_details.reasoning_tokens;
  check("messages_thinking_budget_holds", rt >= 1 && rt <= 9 && m.usage.output_tokens === c.usage.completion_tokens &&
        textOf(m).length > 0, { rt, usage: m.usage, text: textOf(m) });
  const s = ant.messages.stream(req);
  const td = [];
  s.on("streamEvent", (ev) => { if (ev.type === "content_block_delta" && ev.delta.type === "thinking_delta") td.push(ev.delta.thinking); });
  const fin = await s.finalMessage();
  check("messages_thinking_stream", td.join("") === th && fin.content[0].type === "thinking" && fin.content[0].thinking === th, { fin, td });
});

await test("messages_cache_read", async () => {
  const long = "Tell me a story about the sea. ".repeat(40);
  const req = { model, max_tokens: 2, temperature: 0, messages: [{ role: "user", content: long }] };
  const n = await ant.messages.countTokens({ model, messages: req.messages });
  await ant.messages.create(req);
  const b = await ant.messages.create(req);
  check("messages_cache_read", b.usage.cache_read_input_tokens > 0 && b.usage.cache_read_input_tokens % 128 === 0 &&
        b.usage.input_tokens + b.usage.cache_read_input_tokens === n.input_tokens, { usage: b.usage, n });
});

if (process.argv[3]) {
  await test("messages_spec_equals_plain", async () => {
    const ant2 = anthropicClient(process.argv[3]);
    for (const req of [{ model, max_tokens: 24, temperature: 0, system: sys, messages: [{ role: "user", content: user }] },
                       { model, max_tokens: 400, temperature: 0, tools, tool_choice: { type: "tool", name: "get_weather" }, messages: [{ role: "user", content: "Weather in Rome?" }] },
                       { model, max_tokens: 16, temperature: 0, thinking: { type: "enabled", budget_tokens: 8 }, messages: [{ role: "user", content: user }] }]) {
      const a = await ant.messages.create(req), b = await ant2.messages.stream(req).finalMessage();
      const strip = (m) => JSON.stringify(m.content.map((c) => ({ ...c, id: undefined })));
      check(`messages_spec_equals_plain_${req.max_tokens}`, strip(a) === strip(b) && a.stop_reason === b.stop_reason, { a: a.content, b: b.content });
    }
  });
}

// refusals: Anthropic's error shape, naming the member
const bad = [
  ["max_tokens_missing", { model, messages: [{ role: "user", content: "x" }] }, "max_tokens"],
  ["max_tokens_zero", { model, max_tokens: 0, messages: [{ role: "user", content: "x" }] }, "max_tokens"],
  ["image_block", { model, max_tokens: 4, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "AA==" } }] }] }, "messages[0].content[0].source.data: the data is not a PNG file"],
  ["role_system", { model, max_tokens: 4, messages: [{ role: "system", content: "x" }] }, "messages[0].role"],
  ["temperature", { model, max_tokens: 4, temperature: 1.5, messages: [{ role: "user", content: "x" }] }, "temperature"],
  ["any_without_tools", { model, max_tokens: 4, tool_choice: { type: "any" }, messages: [{ role: "user", content: "x" }] }, "tool_choice"],
  ["server_tool", { model, max_tokens: 4, tools: [{ type: "web_search_20250305", name: "web_search" }], messages: [{ role: "user", content: "x" }] }, "tools[0].type"],
  ["tool_not_found", { model, max_tokens: 4, tools, tool_choice: { type: "tool", name: "nope" }, messages: [{ role: "user", content: "x" }] }, "tool_choice"],
  ["tool_result_no_id", { model, max_tokens: 4, messages: [{ role: "user", content: [{ type: "tool_result", content: "x" }] }] }, "tool_use_id"],
  ["thinking_budget", { model, max_tokens: 4, thinking: { type: "enabled", budget_tokens: 8 }, messages: [{ role: "user", content: "x" }] }, "budget_tokens"],
  ["unknown_model", { model: "claude-nope", max_tokens: 4, messages: [{ role: "user", content: "x" }] }, "claude-nope"],
];
for (const [name, body, needle] of bad) {
  await test(`messages_refuse_${name}`, async () => {
    try {
      await ant.messages.create(body);
      check(`messages_refuse_${name}`, false, "accepted");
    } catch (e) {
      const want = name === "unknown_model" ? [404, "not_found_error"] : [400, "invalid_request_error"];
      check(`messages_refuse_${name}`, e.status === want[0] && e.error && e.error.type === "error" && e.error.error.type === want[1] &&
            e.error.error.message.includes(needle), { status: e.status, error: e.error });
    }
  });
}
await test("messages_count_tokens_refuse", async () => {
  try {
    await ant.messages.countTokens({ model, messages: [] });
    check("messages_count_tokens_refuse", false, "accepted");
  } catch (e) {
    check("messages_count_tokens_refuse", e.status === 400 && e.error.error.message.startsWith("messages"), e.error);
  }
});

console.log(failures() ? `api_messages: ${failures()} failed` : "api_messages: all passed");
process.exit(failures() ? 1 : 0);
