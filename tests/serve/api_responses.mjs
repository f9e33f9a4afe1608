// POST /v1/responses through the official OpenAI SDK (npm `openai`, tests/oracle) against an
// exact `ds41 serve` on models/demo: greedy answers equal the same conversation through
// /v1/chat/completions (same prompt, same tokens), streamed events assemble into the same
// response, function tools (other tool types skipped) with a function_call ->
// function_call_output round trip, reasoning items, and the 400s for stored state.
//   node tests/serve/api_responses.mjs PORT
import { createRequire } from "module";
import { check, failures, openaiClient, test } from "./sdk_check.mjs";
const require = createRequire(import.meta.url);
const Ajv = require("../oracle/node_modules/ajv").default;

const port = process.argv[2];
const oai = openaiClient(port);
const model = (await oai.models.list()).data[0].id;
const sys = "You are terse.", user = "What does telescope mean?";

await test("responses_create_equals_chat", async () => {
  const r = await oai.responses.create({ model, instructions: sys, input: user, max_output_tokens: 12, temperature: 0, store: false });
  const c = await oai.chat.completions.create({ model, max_tokens: 12, temperature: 0, messages: [{ role: "system", content: sys }, { role: "user", content: user }] });
  check("responses_create_shape", r.object === "response" && r.id.startsWith("resp_") && r.status === "incomplete" &&
        r.incomplete_details.reason === "max_output_tokens" && r.output.length === 1 && r.output[0].type === "message" && r.store === false, r);
  check("responses_create_equals_chat", r.output_text === c.choices[0].message.content, { r: r.output_text, c: c.choices[0].message.content });
  check("responses_usage", r.usage.input_tokens === c.usage.prompt_tokens && r.usage.output_tokens === 12 &&
        r.usage.total_tokens === r.usage.input_tokens + 12 && r.usage.input_tokens_details.cached_tokens >= 0 &&
        r.usage.output_tokens_details.reasoning_tokens === 0, { r: r.usage, c: c.usage });
  // input as message items is the same prompt
  const r2 = await oai.responses.create({ model, input: [{ role: "system", content: sys }, { type: "message", role: "user", content: [{ type: "input_text", text: user }] }],
    max_output_tokens: 12, temperature: 0 });
  check("responses_input_items", r2.output_text === r.output_text, { a: r2.output_text, b: r.output_text });
});

await test("responses_stream", async () => {
  const req = { model, instructions: sys, input: user, max_output_tokens: 10, temperature: 0 };
  const whole = await oai.responses.create(req);
  const events = [];
  for await (const ev of await oai.responses.create({ ...req, stream: true })) events.push(ev);
  const types = events.map((e) => e.type);
  const deltas = events.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta).join("");
  const last = events.at(-1);
  check("responses_stream_events", types[0] === "response.created" && types.includes("response.output_item.added") &&
        types.includes("response.output_text.done") && last.type === "response.incomplete" &&
        events.every((e, i) => e.sequence_number === i), types);
  check("responses_stream_equals_create", deltas === whole.output_text && last.response.output[0].content[0].text === whole.output_text &&
        last.response.usage.output_tokens === 10, { deltas, whole: whole.output_text });
  // the SDK's stream helper accepts the events (its lifecycle and identity checks)
  const s = oai.responses.stream(req);
  let text = "";
  s.on("response.output_text.delta", (e) => { text += e.delta; });
  for await (const _ of s) { /* drain */ }
  check("responses_stream_helper", text === whole.output_text, { text, whole: whole.output_text });
});

const weather = { type: "object", properties: { city: { type: "string", enum: ["Paris", "Rome"] }, days: { type: "integer" } },
                  required: ["city", "days"], additionalProperties: false };
const tools = [{ type: "function", name: "get_weather", description: "Weather forecast for a city", parameters: weather },
               { type: "web_search_preview" }, { type: "file_search", vector_store_ids: ["vs_1"] }];
const chatTools = [{ type: "function", function: { name: "get_weather", description: "Weather forecast for a city", parameters: weather } }];
const validate = new Ajv().compile(weather);

await test("responses_tools", async () => {
  const ask = "What is the weather in Paris?";
  const r = await oai.responses.create({ model, input: ask, tools, tool_choice: { type: "function", name: "get_weather" }, max_output_tokens: 400, temperature: 0 });
  const fc = r.output.filter((o) => o.type === "function_call");
  const args = fc.length ? JSON.parse(fc[0].arguments) : null;
  check("responses_tool_forced", r.status === "completed" && fc.length === 1 && fc[0].name === "get_weather" && validate(args) &&
        !JSON.stringify(r.output).includes("DSML"), { r, errors: validate.errors });
  const c = await oai.chat.completions.create({ model, max_tokens: 400, temperature: 0, messages: [{ role: "user", content: ask }], tools: chatTools,
    tool_choice: { type: "function", function: { name: "get_weather" } } });
  const cc = c.choices[0].message.tool_calls;
  check("responses_tool_equals_chat_and_skips_others", cc && cc[0].function.arguments === fc[0].arguments && r.tools.length === 1 &&
        r.usage.input_tokens === c.usage.prompt_tokens, { cc, fc, tools: r.tools, u: [r.usage, c.usage] });
  // streamed arguments
  const ev = [];
  for await (const e of await oai.responses.create({ model, input: ask, tools, tool_choice: "required", max_output_tokens: 400, temperature: 0, stream: true })) ev.push(e);
  const ad = ev.filter((e) => e.type === "response.function_call_arguments.delta").map((e) => e.delta).join("");
  const done = ev.at(-1);
  check("responses_tool_stream", done.type === "response.completed" && ad.length > 0 &&
        done.response.output.some((o) => o.type === "function_call" && o.arguments === ad), { ad, done });
  // round trip: function_call + function_call_output items, as the chat route answers the same history
  const hist = [{ role: "user", content: ask }, { type: "function_call", call_id: fc[0].call_id, name: "get_weather", arguments: fc[0].arguments },
                { type: "function_call_output", call_id: fc[0].call_id, output: "Sunny, 21 C" }];
  const r2 = await oai.responses.create({ model, input: hist, tools, max_output_tokens: 10, temperature: 0 });
  const c2 = await oai.chat.completions.create({ model, max_tokens: 10, temperature: 0, tools: chatTools, messages: [{ role: "user", content: ask },
    { role: "assistant", content: null, tool_calls: [{ id: fc[0].call_id, type: "function", function: { name: "get_weather", arguments: fc[0].arguments } }] },
    { role: "tool", tool_call_id: fc[0].call_id, content: "Sunny, 21 C" }] });
  check("responses_tool_output_round_trip", r2.output_text === (c2.choices[0].message.content || "") && r2.usage.input_tokens === c2.usage.prompt_tokens,
        { r2: r2.output_text, c2: c2.choices[0].message.content, u: [r2.usage, c2.usage] });
});

await test("responses_reasoning", async () => {
  const r = await oai.responses.create({ model, input: user, reasoning: { effort: "high" }, max_output_tokens: 16, temperature: 0 });
  const c = await oai.chat.completions.create({ model, max_tokens: 16, temperature: 0, messages: [{ role: "user", content: user }], reasoning_effort: "high" });
  const rs = r.output.find((o) => o.type === "reasoning");
  check("responses_reasoning_equals_chat", rs && rs.content[0].text === c.choices[0].message.reasoning_content &&
        r.usage.output_tokens_details.reasoning_tokens === c.usage.completion_tokens_details.reasoning_tokens, { r, c: c.choices[0].message });
  // a reasoning item on input goes back as the assistant turn's reasoning, as reasoning_content does in chat
  const hist = [{ role: "user", content: user }, { type: "reasoning", id: "rs_1", summary: [{ type: "summary_text", text: "Think of colours." }] },
                { role: "assistant", content: "Red, green, blue." }, { role: "user", content: "Two more." }];
  const r2 = await oai.responses.create({ model, input: hist, max_output_tokens: 8, temperature: 0 });
  const c2 = await oai.chat.completions.create({ model, max_tokens: 8, temperature: 0, messages: [{ role: "user", content: user },
    { role: "assistant", content: "Red, green, blue.", reasoning_content: "Think of colours." }, { role: "user", content: "Two more." }],
    chat_template_kwargs: { thinking: false } });
  check("responses_reasoning_item_input", r2.output_text === c2.choices[0].message.content && r2.usage.input_tokens === c2.usage.prompt_tokens,
        { r2: [r2.output_text, r2.usage], c2: [c2.choices[0].message.content, c2.usage] });
});

const bad = [
  ["store_true", { model, input: "x", store: true }, "store"],
  ["previous_response_id", { model, input: "x", previous_response_id: "resp_1" }, "previous_response_id"],
  ["input_missing", { model }, "input"],
  ["input_image", { model, input: [{ role: "user", content: [{ type: "input_image", image_url: "http://x/y.png" }] }] }, "input"],
  ["item_type", { model, input: [{ type: "wizard" }] }, "input"],
  ["call_output_no_id", { model, input: [{ type: "function_call_output", output: "x" }] }, "input"],
  ["item_reference", { model, input: [{ type: "item_reference", id: "msg_1" }] }, "input"],
  ["max_output_tokens", { model, input: "x", max_output_tokens: 0 }, "max_output_tokens"],
  ["temperature", { model, input: "x", temperature: 3 }, "temperature"],
  ["tool_choice_unknown", { model, input: "x", tools, tool_choice: { type: "function", name: "nope" } }, "tool_choice"],
];
for (const [name, body, param] of bad) {
  await test(`responses_refuse_${name}`, async () => {
    try {
      await oai.responses.create(body);
      check(`responses_refuse_${name}`, false, "accepted");
    } catch (e) {
      check(`responses_refuse_${name}`, e.status === 400 && e.error && e.error.param === param && e.error.message.length > 10, { status: e.status, error: e.error });
    }
  });
}
console.log(failures() ? `api_responses: ${failures()} failed` : "api_responses: all passed");
process.exit(failures() ? 1 : 0);
