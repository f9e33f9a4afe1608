// Images through the official SDKs (npm `openai` and `@anthropic-ai/sdk`, tests/oracle) against an
// exact `ds41 serve` on a checkpoint with a vision tower (tests/vision.test.sh starts it):
//   node tests/serve/vision_sdk.mjs PORT CTX PNG PNG_ANSWER JPEG JPEG_ANSWER PROMPT_TOKENS
// PNG_ANSWER / JPEG_ANSWER: files holding `ds41 run --image` 's greedy answer to the user message
// [image, "What colour?"] on the same file; PROMPT_TOKENS: the positions the PNG's prompt
// prefills (its ids with the image's span, as `ds41 image` counts it).
// Every route must give that answer (exact mode, greedy) and count those positions in usage;
// the prefix of the chat route's prefill is cross-checked with /metrics. Malformed image parts
// get 400s naming the field, in each API's error shape, and a request whose image spans overflow
// the context is refused at once.
// Prints PASS / FAIL lines; exits 1 if any failed.
import { readFileSync } from "fs";
import { anthropicClient, check, failures, openaiClient, test } from "./sdk_check.mjs";

const [port, ctxArg, pngFile, pngAnsFile, jpgFile, jpgAnsFile, ptArg] = process.argv.slice(2);
const ctx = Number(ctxArg), promptTokens = Number(ptArg);
const png = readFileSync(pngFile).toString("base64"), jpg = readFileSync(jpgFile).toString("base64");
const pngAns = readFileSync(pngAnsFile, "utf8").replace(/\n$/, ""), jpgAns = readFileSync(jpgAnsFile, "utf8").replace(/\n$/, "");
const pngUrl = `data:image/png;base64,${png}`;
const ant = anthropicClient(port), oai = openaiClient(port);
const model = (await oai.models.list()).data[0].id;
const q = "What colour?";
// skip_special_tokens false on the chat route: ds41 run prints every token (the other routes
// have no such member; the answers here hold no special token, which the equality checks)
const greedy = { model, max_tokens: 8, temperature: 0 };
const textOf = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");
const prefilled = async () => {
  const t = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const m = t.match(/^vllm:prompt_tokens_total\{[^}]*\} (\d+)/m);
  return m ? Number(m[1]) : NaN;
};

await test("vision_sdk_chat", async () => {
  const before = await prefilled();
  const c = await oai.chat.completions.create({ ...greedy, skip_special_tokens: false,
    messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: pngUrl } }, { type: "text", text: q }] }] });
  const after = await prefilled();
  check("vision_sdk_chat_equals_run", c.choices[0].message.content === pngAns, { got: c.choices[0].message.content, run: pngAns });
  check("vision_sdk_chat_usage", c.usage.prompt_tokens === promptTokens, { usage: c.usage, want: promptTokens });
  check("vision_sdk_chat_usage_is_prefill", after - before === c.usage.prompt_tokens, { before, after, usage: c.usage });
});

await test("vision_sdk_responses", async () => {
  const r = await oai.responses.create({ model, max_output_tokens: 8, temperature: 0,
    input: [{ role: "user", content: [{ type: "input_image", image_url: pngUrl, detail: "auto" }, { type: "input_text", text: q }] }] });
  check("vision_sdk_responses_equals_run", r.output_text === pngAns, { got: r.output_text, run: pngAns });
  check("vision_sdk_responses_usage", r.usage.input_tokens === promptTokens, { usage: r.usage, want: promptTokens });
});

await test("vision_sdk_messages", async () => {
  const content = [{ type: "image", source: { type: "base64", media_type: "image/png", data: png } }, { type: "text", text: q }];
  const m = await ant.messages.create({ ...greedy, messages: [{ role: "user", content }] });
  check("vision_sdk_messages_equals_run", textOf(m) === pngAns, { got: textOf(m), run: pngAns });
  check("vision_sdk_messages_usage", m.usage.input_tokens + m.usage.cache_read_input_tokens === promptTokens, { usage: m.usage, want: promptTokens });
  const n = await ant.messages.countTokens({ model, messages: [{ role: "user", content }] });
  check("vision_sdk_messages_count_tokens", n.input_tokens === promptTokens, { n, want: promptTokens });
  // source.type url with a data: URL is the same image
  const u = await ant.messages.create({ ...greedy, messages: [{ role: "user", content: [{ type: "image", source: { type: "url", url: pngUrl } },
    { type: "text", text: q }] }] });
  check("vision_sdk_messages_data_url", textOf(u) === pngAns, { got: textOf(u), run: pngAns });
  const s = ant.messages.stream({ ...greedy, messages: [{ role: "user", content }] });
  const fin = await s.finalMessage();
  check("vision_sdk_messages_stream", textOf(fin) === pngAns, { got: textOf(fin), run: pngAns });
});

await test("vision_sdk_messages_jpeg", async () => {
  const m = await ant.messages.create({ ...greedy, messages: [{ role: "user", content: [
    { type: "image", source: { type: "base64", media_type: "image/jpeg", data: jpg } }, { type: "text", text: q }] }] });
  check("vision_sdk_messages_jpeg_equals_run", textOf(m) === jpgAns && jpgAns !== pngAns, { got: textOf(m), run: jpgAns, png: pngAns });
});

// an image inside a tool result: the same prompt as the chat route's tool message with the image part
await test("vision_sdk_tool_result", async () => {
  // (no tools offered: their declaration would not fit the test model's 512 positions)
  const m = await ant.messages.create({ ...greedy, messages: [
    { role: "user", content: "Take a picture." },
    { role: "assistant", content: [{ type: "tool_use", id: "toolu_1", name: "camera", input: {} }] },
    { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: [
      { type: "image", source: { type: "base64", media_type: "image/png", data: png } }, { type: "text", text: "the picture" }] }] }] });
  const c = await oai.chat.completions.create({ ...greedy, messages: [
    { role: "user", content: "Take a picture." },
    { role: "assistant", content: null, tool_calls: [{ id: "toolu_1", type: "function", function: { name: "camera", arguments: "{}" } }] },
    { role: "tool", tool_call_id: "toolu_1", content: [{ type: "image_url", image_url: { url: pngUrl } }, { type: "text", text: "the picture" }] }] });
  check("vision_sdk_tool_result_equals_chat", textOf(m) === (c.choices[0].message.content ?? "") &&
        m.usage.input_tokens + m.usage.cache_read_input_tokens === c.usage.prompt_tokens && c.usage.prompt_tokens > promptTokens,
        { m: textOf(m), c: c.choices[0].message.content, mu: m.usage, cu: c.usage });
});

// the image spans count before the tower runs: max_tokens that fits the text but not the spans
await test("vision_sdk_context", async () => {
  const messages = [{ role: "user", content: [{ type: "image_url", image_url: { url: pngUrl } }, { type: "text", text: q }] }];
  try {
    await oai.chat.completions.create({ model, temperature: 0, max_tokens: ctx - promptTokens + 2, messages });
    check("vision_sdk_context_chat", false, "accepted");
  } catch (e) {
    check("vision_sdk_context_chat", e.status === 400 && e.error && e.error.code === "context_length_exceeded" &&
          e.error.message.includes(`(${promptTokens} in the prompt`), { status: e.status, error: e.error });
  }
  try {
    await ant.messages.create({ model, temperature: 0, max_tokens: ctx - promptTokens + 2, messages: [{ role: "user", content: [
      { type: "image", source: { type: "base64", media_type: "image/png", data: png } }, { type: "text", text: q }] }] });
    check("vision_sdk_context_messages", false, "accepted");
  } catch (e) {
    check("vision_sdk_context_messages", e.status === 400 && e.error.type === "error" && e.error.error.type === "invalid_request_error" &&
          e.error.error.message.includes(`(${promptTokens} in the prompt`), { status: e.status, error: e.error });
  }
  // one fewer fits: admitted (the stream is dropped after its first chunk)
  const s = await oai.chat.completions.create({ model, temperature: 0, max_tokens: ctx - promptTokens + 1, messages, stream: true });
  let got = 0;
  for await (const ch of s) { if (ch.choices) got++; break; }
  check("vision_sdk_context_fits", got === 1, { got });
});

const pngSrc = { type: "base64", media_type: "image/png", data: png };
const antBad = [
  ["https", { type: "url", url: "https://example.com/a.png" }, "messages[0].content[0].source.url: http(s) URLs are not fetched"],
  ["file", { type: "file", file_id: "file_1" }, "messages[0].content[0].source: file sources need the Files API"],
  ["gif", { ...pngSrc, media_type: "image/gif" }, "messages[0].content[0].source.media_type: expected image/png or image/jpeg"],
  ["base64", { ...pngSrc, data: "iVBO*w0K" }, "messages[0].content[0].source.data: base64: character 4"],
  ["not_png", { ...pngSrc, data: jpg }, "messages[0].content[0].source.data: the data is not a PNG file"],
  ["truncated", { ...pngSrc, data: png.slice(0, 200) }, "messages[0].content[0].source.data: "],
  ["no_type", { data: png }, "messages[0].content[0].source.type: required"],
];
for (const [name, source, needle] of antBad) {
  await test(`vision_sdk_messages_refuse_${name}`, async () => {
    try {
      await ant.messages.create({ ...greedy, messages: [{ role: "user", content: [{ type: "image", source }, { type: "text", text: q }] }] });
      check(`vision_sdk_messages_refuse_${name}`, false, "accepted");
    } catch (e) {
      check(`vision_sdk_messages_refuse_${name}`, e.status === 400 && e.error && e.error.type === "error" &&
            e.error.error.type === "invalid_request_error" && e.error.error.message.startsWith(needle), { status: e.status, error: e.error });
    }
  });
}
const respBad = [
  ["file_id", { type: "input_image", file_id: "file_1", detail: "auto" }, "input[0].content[0].file_id: this server keeps no files"],
  ["https", { type: "input_image", image_url: "https://example.com/a.png", detail: "auto" }, "input[0].content[0].image_url: http(s) URLs are not fetched"],
  ["base64", { type: "input_image", image_url: "data:image/png;base64,iVBO*w0K", detail: "auto" }, "input[0].content[0].image_url: base64: character 4"],
  ["detail", { type: "input_image", image_url: pngUrl, detail: "ultra" }, "input[0].content[0].detail: expected auto, low or high"],
];
for (const [name, part, needle] of respBad) {
  await test(`vision_sdk_responses_refuse_${name}`, async () => {
    try {
      await oai.responses.create({ model, max_output_tokens: 8, input: [{ role: "user", content: [part, { type: "input_text", text: q }] }] });
      check(`vision_sdk_responses_refuse_${name}`, false, "accepted");
    } catch (e) {
      check(`vision_sdk_responses_refuse_${name}`, e.status === 400 && e.error && e.error.param === "input" &&
            e.error.message.startsWith(needle), { status: e.status, error: e.error });
    }
  });
}
process.exit(failures() ? 1 : 0);
